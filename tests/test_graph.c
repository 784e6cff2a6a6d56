// Graph building: shapes that do not fit, unknown activations, bad layer
// configs, each reported at the layer with its exact text.
#include <criterion/criterion.h>

#include "capture.h"
#include "kdcc.h"

static void build(const char *path, const char *dist) {
  opt_quiet_warnings = true;
  Model *m = load_model(path);
  Dist *d = load_dist(m, dist, NULL);
  Graph *g = build_graph(m, d, 32);
  build_backward(g);
  propagate_shardings(g);
}

static void expect_error(const char *path, const char *dist, const char *msg) {
  Captured c;
  IN_CHILD(c, build(path, dist));
  cr_assert_eq(c.status, 1, "%s: exit status %d, stderr: %s", path, c.status, c.err);
  cr_assert_str_eq(c.err, msg);
}

Test(graph, add_of_different_widths) {
  expect_error("tests/bad/shape_add.json", NULL,
               "tests/bad/shape_add.json:224:38: error: layer 'add': input 1 has shape "
               "(None, 32), which does not fit (None, 64)\n");
}

Test(graph, conv_on_a_matrix) {
  expect_error("tests/bad/shape_conv_rank.json", NULL,
               "tests/bad/shape_conv_rank.json:237:7: error: layer 'c': Conv2D needs an input "
               "of rank 4 (batch, h, w, c), got (None, 64)\n");
}

Test(graph, reshape_with_the_wrong_count) {
  expect_error("tests/bad/shape_reshape.json", NULL,
               "tests/bad/shape_reshape.json:395:27: error: layer 'cat': cannot reshape "
               "(None, 16) to target_shape with 21 elements\n");
}

Test(graph, unknown_activation) {
  expect_error("tests/bad/unknown_activation.json", NULL,
               "tests/bad/unknown_activation.json:41:25: error: layer 'a': unknown activation "
               "'swishy'\n");
}

Test(graph, zero_units) {
  expect_error("tests/bad/units_zero.json", NULL,
               "tests/bad/units_zero.json:40:20: error: layer 'a': 'units' must be positive\n");
}

Test(graph, layout_not_divisible_names_layer_and_variable) {
  expect_error("models/cnn.json", "models/cnn_bad.dist.json",
               "models/cnn_bad.dist.json:24:5: error: layer 'dense': dimension 1 of "
               "'dense/kernel' (size 10) is not divisible by mesh axis 'model' (size 4) "
               "(layout key 'dense.*kernel')\n");
}

Test(graph, batch_not_divisible_by_the_batch_axis) {
  Captured c;
  IN_CHILD(c, {
    opt_quiet_warnings = true;
    Model *m = load_model("models/seed_mlp.json");
    build_graph(m, load_dist(m, "models/seed_mlp_dp.dist.json", NULL), 12);
  });
  cr_assert_eq(c.status, 1);
  cr_assert_str_eq(c.err, "models/seed_mlp_dp.dist.json:5:7: error: batch size 12 is not "
                          "divisible by mesh axis 'batch' (size 8), which splits the batch; use "
                          "a --batch-size that is a multiple of 8\n");
  // the batch axis named by batch_dim_name; 'devices'; a size --mesh gave
  expect_error("tests/good/seq_mlp.json", "tests/bad/dist_batch_divisible.json",
               "tests/bad/dist_batch_divisible.json:2:31: error: batch size 32 is not divisible "
               "by mesh axis 'model' (size 3), which splits the batch; use a --batch-size that "
               "is a multiple of 3\n");
  expect_error("tests/good/seq_mlp.json", "tests/bad/dist_devices_batch.json",
               "tests/bad/dist_devices_batch.json:1:45: error: batch size 32 is not divisible "
               "by mesh axis 'batch' (size 5), which splits the batch; use a --batch-size that "
               "is a multiple of 5\n");
  IN_CHILD(c, {
    opt_quiet_warnings = true;
    Model *m = load_model("models/seed_mlp.json");
    build_graph(m, load_dist(m, "models/seed_mlp_dp.dist.json", "batch=3"), 32);
  });
  cr_assert_str_eq(c.err, "kdcc: error: batch size 32 is not divisible by mesh axis 'batch' "
                          "(size 3, from --mesh), which splits the batch; use a --batch-size that "
                          "is a multiple of 3\n");
}

// Window parameters are checked at their JSON value: a zero would divide by zero.
Test(graph, window_parameters_must_be_positive) {
  expect_error("tests/bad/conv_strides_zero.json", NULL,
               "tests/bad/conv_strides_zero.json:4:104: error: layer 'c': 'strides' must be "
               "positive\n");
  expect_error("tests/bad/pool_size_zero.json", NULL,
               "tests/bad/pool_size_zero.json:4:72: error: layer 'p': 'pool_size' must be "
               "positive\n");
  expect_error("tests/bad/pool_strides_zero.json", NULL,
               "tests/bad/pool_strides_zero.json:4:85: error: layer 'p': 'strides' must be "
               "positive\n");
}

// Sizes past the limits (kdcc.h's MAX_DIM, MAX_ELEMS) are errors, never wrapped products.
Test(graph, sizes_over_the_limits) {
  expect_error("tests/bad/units_2_40.json", NULL,
               "tests/bad/units_2_40.json:4:60: error: layer 'd': 'units' is 1099511627776; a "
               "dimension may be at most 2147483647\n");
  expect_error("tests/bad/kernel_2_40.json", NULL,
               "tests/bad/kernel_2_40.json:4:60: error: layer 'd': a kernel of [2097152, "
               "2097152] would hold more than 2^40 elements, the most a tensor may hold\n");
  expect_error("tests/bad/concat_2_31.json", NULL,
               "tests/bad/concat_2_31.json:4:3: error: layer 'cat': a tensor of shape [32, "
               "4000000000]: dimension 1 is over 2147483647, the most kdcc supports\n");
  expect_error("tests/bad/batch_2_40.json", NULL,
               "tests/bad/batch_2_40.json:3:3: error: layer 'input_layer': a tensor of shape "
               "[32, 1048576, 1048576] (batch 32) holds more than 2^40 elements, the most a "
               "tensor may hold\n");
}

Test(graph, shapes_and_variables_of_the_seed) {
  opt_quiet_warnings = true;
  Model *m = load_model("models/cnn.json");
  Graph *g = build_graph(m, load_dist(m, NULL, NULL), 8);
  // conv2d valid 3x3: 28 -> 26, pool 2 -> 13, conv2d_1 same -> 13, pool -> 6
  cr_assert_eq(g->nvars, 6);
  cr_assert_str_eq(g->vars[0]->path, "conv2d/kernel");
  cr_assert_eq(g->vars[0]->shape.d[3], 8);
  cr_assert_eq(g->vars[4]->shape.d[0], 6 * 6 * 16);
  cr_assert_eq(g->outputs[0]->shape.d[0], 8);
  cr_assert_eq(g->outputs[0]->shape.d[1], 10);
  cr_assert_eq(g->labels[0]->shape.rank, 1, "sparse labels are class ids");
}

Test(graph, integer_ids_into_dense) {
  expect_error("tests/bad/ids_into_dense.json", NULL,
               "tests/bad/ids_into_dense.json:5:23: error: layer 'd': Dense takes float input, "
               "but 'ids' holds integer ids (only Embedding takes integer input)\n");
}

Test(graph, embedding_mask_zero) {
  expect_error("tests/bad/mask_zero.json", NULL,
               "tests/bad/mask_zero.json:4:118: error: layer 'emb': mask_zero is not supported "
               "(kdcc has no masks yet): the model would train without its padding mask\n");
}

// issue 11: regularizers other than L1, L2 and L1L2 are named, at the option
Test(graph, regularizer_unsupported) {
  expect_error("tests/bad/regularizer_orthogonal.json", NULL,
               "tests/bad/regularizer_orthogonal.json:4:98: error: layer 'd': regularizer "
               "'OrthogonalRegularizer' of 'kernel_regularizer' is not supported (only L1, L2 "
               "and L1L2)\n");
  expect_error("tests/bad/regularizer_factor.json", NULL,
               "tests/bad/regularizer_factor.json:4:136: error: layer 'd': 'l2' must be a "
               "finite number\n");
}

// issue 11: Conv1D keeps Keras's kernel [k, cin, cout]; 'causal' keeps the
// steps, a stride 2 'same' halves them (rounding up), 'valid' drops k - 1
Test(graph, conv1d_shapes) {
  opt_quiet_warnings = true;
  Model *m = load_model("tests/gradcheck/conv1d.json");
  Graph *g = build_graph(m, load_dist(m, NULL, NULL), 4);
  cr_assert_str_eq(g->vars[0]->path, "causal/kernel");
  cr_assert_eq(g->vars[0]->shape.rank, 3);
  cr_assert_eq(g->vars[0]->shape.d[1], 3);
  cr_assert_eq(g->vars[2]->shape.d[0], 2, "same/kernel [2, 4, 8]");
  const int64_t steps[] = {9, 5, 3};
  for (int i = 0; i < 3; i++) {
    const Node *y = m->layers[i + 1]->node;
    cr_assert_eq(y->shape.rank, 3);
    cr_assert_eq(y->shape.d[1], steps[i], "layer %d: %lld steps", i, (long long)y->shape.d[1]);
  }
  expect_error("tests/bad/conv1d_dilation.json", NULL,
               "tests/bad/conv1d_dilation.json:4:114: error: layer 'c': Conv1D cannot have "
               "both strides and dilation_rate over 1\n");
  expect_error("tests/bad/conv2d_groups.json", NULL,
               "tests/bad/conv2d_groups.json:4:107: error: layer 'c': groups=3 must divide the "
               "input channels (4) and filters (4)\n");
}

// issue 11: Conv2DTranspose's options kdcc lacks are named
Test(graph, conv_transpose_output_padding) {
  expect_error("tests/bad/conv_transpose_output_padding.json", NULL,
               "tests/bad/conv_transpose_output_padding.json:4:138: error: layer 't': "
               "'output_padding' is not supported\n");
}

// issue 11: constraints other than Keras's four, and axes the variable lacks
Test(graph, constraint_unsupported) {
  expect_error("tests/bad/constraint_kernel.json", NULL,
               "tests/bad/constraint_kernel.json:4:97: error: layer 'd': constraint 'Clip' of "
               "'kernel_constraint' is not supported (only NonNeg, MaxNorm, UnitNorm and "
               "MinMaxNorm)\n");
  expect_error("tests/bad/constraint_axis.json", NULL,
               "tests/bad/constraint_axis.json:4:162: error: layer 'd': 'kernel_constraint' axis "
               "must be integers in [-2, 2) for 'd/kernel' of rank 2\n");
}

// A penalty per regularized variable, summed into the loss the steps report
// and differentiate: "loss" is the compiled loss plus the regularization.
Test(graph, regularizers_join_the_loss) {
  opt_quiet_warnings = true;
  Model *m = load_model("tests/gradcheck/regularizers.json");
  Graph *g = build_graph(m, load_dist(m, NULL, NULL), 4);
  cr_assert_not_null(g->penalty);
  cr_assert_str_eq(g->logs[0].name, "loss");
  cr_assert_eq(g->logs[0].node->op, OP_ADD);
  cr_assert_eq(g->logs[0].node->in[1], g->penalty);
  cr_assert_str_eq(g->logs[0].node->in[0]->name, "compiled_loss");
  Var *k = g->vars[0];
  cr_assert_str_eq(k->path, "conv/kernel");
  cr_assert_float_eq(k->l1, 0.01, 1e-12);
  cr_assert_float_eq(k->l2, 0.0, 1e-12);
}

// More memory per device than --max-memory (default: this machine's): an error at the
// largest tensor's layer, naming the largest three.
Test(graph, memory_over_the_limit) {
  Captured c;
  IN_CHILD(c, {
    opt_quiet_warnings = true;
    check_memory(compile_model("models/seed_mlp.json", NULL, NULL, 16), 100 << 10,
                 "--max-memory 100K");
  });
  cr_assert_eq(c.status, 1);
  cr_assert_str_eq(c.err, "models/seed_mlp.json:61:7: error: one device needs 2520.9 KiB "
                   "(parameters 620.4 KiB, gradients 620.4 KiB, optimizer state 1240.7 KiB, peak "
                   "activations 39.5 KiB), more than --max-memory 100K; the largest tensors: "
                   "sequential/d1/kernel [784, 200] (layer 'd1', with its gradient and optimizer "
                   "state): 2450.0 KiB, sequential/d2/kernel [200, 10] (layer 'd2', with its "
                   "gradient and optimizer state): 31.2 KiB, %3 dot [16, 200] (layer 'd1'): 12.5 "
                   "KiB\n");
  IN_CHILD(c, {
    opt_quiet_warnings = true;
    check_memory(compile_model("models/seed_mlp.json", NULL, NULL, 16), 3 << 20, "x"); // within
    check_memory(compile_model("tests/bad/memory_2_tib.json", NULL, NULL, 32), INT64_C(1) << 40,
                 "1 TiB");
  });
  cr_assert_eq(c.status, 1);
  cr_assert_str_eq(c.err, "tests/bad/memory_2_tib.json:4:3: error: one device needs 8192.2 GiB "
                   "(parameters 2048.0 GiB, gradients 2048.0 GiB, optimizer state 4096.0 GiB, "
                   "peak activations 192.0 MiB), more than 1 TiB; the largest tensors: "
                   "sequential/d/kernel [1048576, 524288] (layer 'd', with its gradient and "
                   "optimizer state): 8192.0 GiB, %2 dot [32, 524288] (layer 'd'): 64.0 MiB, "
                   "%4 bias_add [32, 524288] (layer 'd'): 64.0 MiB\n");
}

// Numbers that become float literals of the program fit float32.
Test(graph, numbers_beyond_float32) {
  expect_error("tests/bad/scale_float_range.json", NULL,
               "tests/bad/scale_float_range.json:4:64: error: layer 'r': 'scale' is 1e+300, "
               "beyond float32's range\n");
  expect_error("tests/bad/init_float_range.json", NULL,
               "tests/bad/init_float_range.json:5:26: error: layer 'd': initializer 'Constant' of "
               "'s/d/kernel' has a parameter beyond float32's range\n");
}
