// The pipeline: every pass, in order, from a model file to a planned
// graph. main.c drives it from the command line, the tests call it directly.
// The IR verifier runs after every pass.
#include "kdcc.h"

Graph *compile_model(const char *model_path, const char *dist_path, const char *mesh, int batch) {
  Model *m = load_model(model_path);
  Dist *d = load_dist(m, dist_path, mesh);
  Graph *g = build_graph(m, d, batch);
  verify_graph(g, "build_graph", false);
  decode_derive(g); // issue 24: generate's decode step, from the forward alone
  build_backward(g);
  find_batch_dims(g);
  verify_graph(g, "build_backward", false);
  propagate_shardings(g);
  verify_graph(g, "propagate_shardings", true);
  fuse_graph(g);
  verify_graph(g, "fuse_graph", true);
  store16(g); // issue 23: saved 16-bit values in 16 bits
  fuse_rounds(g); // issues 22, 23: a ROUND in its operand's kernel
  verify_graph(g, "store16", true);
  find_blocks(g); // issue 25: repeated blocks, which the memory plan and the emitters fold
  group_updates(g); // issue 25: one optimizer call for each run of variables updated alike
  plan_memory(g);
  bucket_gradients(g);
  verify_graph(g, "plan_memory", true);
  decode_finish(g);
  return g;
}
