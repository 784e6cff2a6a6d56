// The pipeline: every pass, in order, from a model file to a planned
// graph. main.c drives it from the command line, the tests call it directly.
#include "kdcc.h"

Graph *compile_model(const char *model_path, const char *dist_path, const char *mesh, int batch) {
  Model *m = load_model(model_path);
  Dist *d = load_dist(m, dist_path, mesh);
  Graph *g = build_graph(m, d, batch);
  build_backward(g);
  propagate_shardings(g);
  fuse_elementwise(g);
  plan_memory(g);
  bucket_gradients(g);
  return g;
}
