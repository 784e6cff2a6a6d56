#!/usr/bin/env bash
# The property everything rests on: a program gives the same losses on any
# mesh. Each model is compiled for several mesh shapes (same spec, --mesh
# changes only the shape), trained under mpirun on synthetic data, and its
# history compared with the one-device run within 1e-5 relative. The data
# leave a ragged last batch on every mesh: 62 samples, 27% held out for
# validation, are 45 to train (16 + 16 + 13) and 17 to validate (16 + 1),
# rows that divide over no batch axis of 2, 4 or 8 devices.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=build/tests/mesh_equiv
mkdir -p $out
fail=0

# model  spec  batch  meshes (the first is the reference)
check() {
  local model=$1 spec=$2 batch=$3; shift 3
  local src=models/$model.json
  [ -f "$src" ] || src=tests/good/$model.json
  local ref="" hists=()
  echo "mesh equivalence: $model with $spec"
  for mesh in "$@"; do
    local tag=${mesh//[=,]/_}
    local exe=$out/$(basename $model)_$tag
    ./kdcc $src --distribution models/$spec --mesh "$mesh" --batch-size $batch -w -o $exe
    local np=1
    for kv in ${mesh//,/ }; do np=$((np * ${kv#*=})); done
    timeout 300 mpirun -np $np --oversubscribe $exe --synthetic 62 --validation-split 0.27 \
      --epochs 2 --batch-size $batch \
      --quiet --history $exe.history.json
    if [ -z "$ref" ]; then ref=$exe.history.json; else hists+=("$exe.history.json"); fi
  done
  python3 tests/compare_history.py 1e-5 "$ref" "${hists[@]}" || fail=1
}

check seed_mlp seed_mlp_fixed.dist.json 16 data=1,model=1 data=8,model=1 data=4,model=2 data=2,model=4 data=1,model=8
check seed_mlp seed_mlp_dp.dist.json 16 batch=1 batch=8 batch=2
check func_branches func_branches.dist.json 16 data=1,model=1 data=2,model=4 data=1,model=8 data=4,model=2
check cnn cnn.dist.json 8 data=1,model=1 data=2,model=4 data=8,model=1
check megatron megatron.dist.json 16 data=1,model=1 data=2,model=4 data=1,model=8
# plain SGD: on one device the update is folded into the gradient's GEMM
# (fuse.c); on the meshes most gradients are reduced first and are not
check func_branches_sgd func_branches.dist.json 16 data=1,model=1 data=2,model=4 data=1,model=8
# the op core's models: vocab-parallel per-token crossentropy, integer ids
# into an embedding split on the vocabulary, two inputs, two heads with a
# loss dict and weights, a layer called twice
check per_token per_token.dist.json 16 data=1,model=1 data=2,model=4 data=1,model=8 data=8,model=1
check int_tokens int_tokens.dist.json 16 data=1,model=1 data=2,model=4 data=1,model=8
check wide_deep wide_deep.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2
check two_heads two_heads.dist.json 16 data=1,model=1 data=2,model=4 data=1,model=8
check shared_dense shared_dense.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1
# Multiply, Permute (a transpose) and GlobalAveragePooling1D (a sum over a dim)
check ../tests/gradcheck/gated ../tests/good/gated.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1
# a transformer block: token and position embeddings, layer norm, causal
# multi-head attention (heads split over 'model', Megatron), RMS norm, gelu MLP
check ../tests/gradcheck/attention ../tests/good/attention.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# grouped-query attention: 2 key/value heads repeated to 4 query heads, split over 'model'
check ../tests/gradcheck/gqa ../tests/good/attention.dist.json 16 data=1,model=1 data=2,model=2 data=4,model=2
# the keras_ref transformers: a GPT (Megatron, and FSDP with weights split over 'data')
# and a Llama block (RMS norm, grouped-query attention, SwiGLU)
check gpt gpt.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1
check gpt gpt_fsdp.dist.json 16 data=1,model=1 data=2,model=4
# sequence parallelism: the residual stream split on the sequence over 'model'
# (layer norms on sequence shards, all-gathers before attention and the MLP,
# reduce-scatters after; the token ids sliced on the sequence)
check gpt ../tests/good/gpt_seqpar.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2
check llama llama.dist.json 16 data=1,model=1 data=2,model=4
check llama ../tests/good/llama_hub.dist.json 16 batch=1,model=1 batch=2,model=4
# the batch gathered over 'data' and sliced again (d1's output replicated
# on the batch): all-gather and slice of blocks of unequal rows
check seed_mlp ../tests/good/seed_mlp_gather.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1 data=4,model=2
# issue 10: EinsumDense in every form, kernels split over 'model' along heads, rows,
# a contraction's batch dim and a transposed kernel's free dim; gelu_approximate
check ../tests/gradcheck/einsum ../tests/good/einsum.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 10: ReversibleEmbedding tied and untied, tables split on the vocabulary: the
# reverse call's logits split on the class dim
check ../tests/gradcheck/rev_emb ../tests/good/rev_emb.dist.json 16 data=1,model=1 data=2,model=4 data=1,model=8 data=8,model=1
# issue 10: an attention_mask input (int32 0/1) with and without the causal mask, heads
# split over 'model' while the mask (the same for every head) is not
check ../tests/gradcheck/attn_mask ../tests/good/attn_mask.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: the new activations, ZeroPadding/Cropping 1D/2D, GlobalAveragePooling2D, ReLU layers
check ../tests/gradcheck/acts_pool ../tests/good/acts_pool.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1
check ../tests/gradcheck/pools ../tests/good/pools.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1
# issue 11: BatchNormalization (global batch statistics; evaluate on the moving ones)
check ../tests/gradcheck/batchnorm ../tests/good/batchnorm.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1
# frozen layers (trainable false): a batch norm on its moving statistics, split channels,
# and a split Dense kernel, neither updated; the trained conv below them gets their gradient
check ../tests/gradcheck/frozen ../tests/good/frozen.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1
# models used as layers: a Sequential backbone and a Functional block, their layers split;
# fine-tuning under a frozen nested backbone (its batch norm on the moving statistics)
check nested nested.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1
check nested_frozen nested_frozen.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1
# issue 11: L1/L2/L1L2 and activity regularizers, their penalties partial sums over the
# split kernels' dims (conv channels, embedding columns, dense rows split over 'model')
check ../tests/gradcheck/regularizers ../tests/good/regularizers.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: weight constraints after every update, the norms' sums over split rows all-reduced
check ../tests/gradcheck/constrained ../tests/good/constrained.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: Conv1D (causal, strided same, valid) on [b, steps, 1, c] views, channels split
check ../tests/gradcheck/conv1d ../tests/good/conv1d.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: dilated Conv2D and Conv1D (dilation_rate), channels split
check ../tests/gradcheck/dilated ../tests/good/dilated.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: Conv2D groups and DepthwiseConv2D; issue 15: each one conv over its groups, the
# channels split over 'model' where the axis divides the groups (the depthwise convs' 8, the
# grouped conv's 2 over model=2), gathered where it does not (the grouped conv over model=4, 8)
check ../tests/gradcheck/grouped ../tests/good/grouped.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1 data=1,model=8
# issue 11: Conv2DTranspose (the conv's input gradient as a layer), filters and input channels split
check ../tests/gradcheck/transpose ../tests/good/transpose.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: the losses (huber, log_cosh, kl_divergence, poisson, cosine_similarity, mape, msle;
# hinge, squared_hinge with the labels' 0/1 test all-reduced over the batch, categorical_hinge,
# label smoothing on the crossentropies), heads split on their inputs or on their classes
check ../tests/gradcheck/losses_reg ../tests/good/losses.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1
check ../tests/gradcheck/losses_cls ../tests/good/losses.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1
# issue 11: optimizers, clipping and learning-rate schedules: the global norm's sums of
# squares cross the split kernels (and the data-parallel gradients are summed first),
# Nadam's running product, Adagrad's first accumulator, Lion's weight decay
for m in opt_nadam_global opt_adagrad_clipnorm opt_lion_clipvalue opt_adam_amsgrad; do
  check ../tests/good/$m ../tests/good/opt.dist.json 16 data=1,model=1 data=2,model=4 data=8,model=1 data=1,model=8
done
# issue 11: Subtract, Maximum, Minimum (a tie), Average, Dot (normalized), units split
check ../tests/gradcheck/merging ../tests/good/merging.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: Softmax and LayerNormalization over other axes, UnitNormalization, PReLU, features split
check ../tests/gradcheck/norms_acts ../tests/good/norms_acts.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: GroupNormalization (groups split), GaussianNoise, GaussianDropout, SpatialDropout1D/2D
# (their draws keyed by global indices)
check ../tests/gradcheck/noise_norms ../tests/good/noise_norms.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: DepthwiseConv1D (input channels split), SeparableConv1D, Conv1DTranspose
check ../tests/gradcheck/conv1d_family ../tests/good/conv1d_family.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: Normalization's constants, replicated, sliced to the split features
check ../tests/gradcheck/normalization ../tests/good/normalization.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: output_padding of Conv2DTranspose and Conv1DTranspose
check ../tests/gradcheck/transpose_op ../tests/good/transpose_op.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 11: SimpleRNN, LSTM (going backwards), GRU, Bidirectional LSTM and GRU; the LSTMs'
# kernels split on their units over 'model' (the recurrence gathers them)
check ../tests/gradcheck/rnn ../tests/good/rnn.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1
# issue 24: keras-hub's RotaryEmbedding on heads split over 'model' (from a start_index), on
# features split (moved to the sequence), on a sequence split by a layout (its blocks' global
# positions); linear, dynamic and YaRN frequencies
check ../tests/gradcheck/rope ../tests/good/rope.dist.json 16 data=1,model=1 data=2,model=4 data=4,model=2 data=8,model=1 data=1,model=8
exit $fail
