#!/usr/bin/env python3
"""Train the reference models in real Keras 3 (JAX backend, 8 virtual CPU
devices, keras.distribution) and write what kdcc must reproduce.

Usage (from the repository root, with tests/keras_ref/requirements.txt):

    python3 tests/keras_ref/run_ref.py                  # rewrite tests/fixtures/keras_ref/
    python3 tests/keras_ref/run_ref.py --out DIR        # write elsewhere
    python3 tests/keras_ref/run_ref.py --out DIR --check tests/fixtures/keras_ref
                                                        # and compare with the committed ones
    python3 tests/keras_ref/run_ref.py --out DIR --hlo  # also DIR/<case>.hlo.txt: the
                                                        # optimized HLO of Keras's train step

Cases (model, distribution spec from models/):

    seed_mlp_dp     seed_mlp       seed_mlp_dp.dist.json     DataParallel (8,)
    seed_mlp_mp     seed_mlp       seed_mlp_fixed.dist.json  ModelParallel (2,4)
    func_branches   func_branches  func_branches.dist.json   ModelParallel (2,4)
    cnn             cnn            cnn.dist.json             ModelParallel (2,4)
    megatron        megatron       megatron.dist.json        ModelParallel (2,4)
    wide_deep       wide_deep      wide_deep.dist.json       ModelParallel (2,4)  2 float inputs
    wide_deep_dp    wide_deep      wide_deep_dp.dist.json    DataParallel (8,)
    two_heads       two_heads      two_heads.dist.json       ModelParallel (2,4)  2 outputs, 2 losses
    two_heads_dp    two_heads      two_heads_dp.dist.json    DataParallel (8,)
    int_tokens      int_tokens     int_tokens.dist.json      ModelParallel (2,4)  int32 ids, Embedding
                                                             rows (vocabulary) split
    int_tokens_dim  int_tokens     int_tokens_dim.dist.json  ModelParallel (2,4)  Embedding columns split
    int_tokens_dp   int_tokens     int_tokens_dp.dist.json   DataParallel (8,)
    per_token       per_token      per_token.dist.json       ModelParallel (2,4)  a class per token, the
                                                             logits' class dim split
    per_token_dp    per_token      per_token_dp.dist.json    DataParallel (8,)
    shared_dense    shared_dense   shared_dense.dist.json    ModelParallel (2,4)  one Dense called twice
    shared_dense_dp shared_dense   shared_dense_dp.dist.json DataParallel (8,)
    text_cls        text_cls       text_cls.dist.json        ModelParallel (2,4)  Embedding, MHA, LayerNorm,
                                                             GlobalAveragePooling1D; heads split
    text_cls_dp     text_cls       text_cls_dp.dist.json     DataParallel (8,)
    gpt             gpt            gpt.dist.json             ModelParallel (2,4)  causal MHA, keras_hub
                                                             PositionEmbedding, gelu MLP, Megatron
    gpt_fsdp        gpt            gpt_fsdp.dist.json        ModelParallel (2,4)  Gemma-style: matrices
                                                             over both 'data' and 'model'
    gpt_dp          gpt            gpt_dp.dist.json          DataParallel (8,)
    vit             vit            vit.dist.json             ModelParallel (2,4)  Conv2D patches, Reshape,
                                                             encoder block (no mask), Megatron
    vit_dp          vit            vit_dp.dist.json          DataParallel (8,)
    llama           llama          llama.dist.json           ModelParallel (2,4)  RMSNormalization,
                                                             GroupQueryAttention (causal), SwiGLU;
                                                             query heads split, key/value replicated
    llama_dp        llama          llama_dp.dist.json        DataParallel (8,)
    bn_cnn          bn_cnn         bn_cnn.dist.json          ModelParallel (2,4)  BatchNormalization
                                                             (synchronized: global batch statistics,
                                                             moving statistics), Add, ReLU,
                                                             GlobalAveragePooling2D; channels split
    bn_cnn_dp       bn_cnn         bn_cnn_dp.dist.json       DataParallel (8,)
    einsum          einsum         einsum.dist.json          ModelParallel (2,4)  EinsumDense in every
                                                             form (ellipses, bias axes, a batch dim,
                                                             a transposed kernel, a summed dim),
                                                             gelu_approximate, regularizers, MaxNorm
    einsum_dp       einsum         einsum_dp.dist.json       DataParallel (8,)
    rev_emb         rev_emb        rev_emb.dist.json         ModelParallel (2,4)  ReversibleEmbedding tied
                                                             and untied (soft cap), tables split on
                                                             the vocabulary
    rev_emb_dp      rev_emb        rev_emb_dp.dist.json      DataParallel (8,)
    attn_mask       attn_mask      attn_mask.dist.json       ModelParallel (2,4)  attention_mask from an
                                                             int32 input (0/1), with and without
                                                             use_causal_mask; heads split
    attn_mask_dp    attn_mask      attn_mask_dp.dist.json    DataParallel (8,)
    regularized     regularized    regularized.dist.json     ModelParallel (2,4)  L1/L2/L1L2 regularizers
                                                             on conv, dense, embedding and layer norm
                                                             variables, activity regularizers; the
                                                             regularized variables split
    regularized_dp  regularized    regularized_dp.dist.json  DataParallel (8,)
    constrained     constrained    constrained.dist.json     ModelParallel (2,4)  NonNeg, MaxNorm, UnitNorm,
                                                             MinMaxNorm after every update; the
                                                             norms' sums over split dims
    constrained_dp  constrained    constrained_dp.dist.json  DataParallel (8,)
    frozen          frozen         frozen.dist.json          ModelParallel (2,4)  trainable=False on a conv,
                                                             a batch norm (moving statistics in
                                                             training) and a regularized Dense: not
                                                             trained, their penalty not in the loss
    frozen_dp       frozen         frozen_dp.dist.json       DataParallel (8,)
    nested          nested         nested.dist.json          ModelParallel (2,4)  a Sequential backbone and
                                                             a Functional block as layers; the
                                                             layout map reaches inside them
    nested_dp       nested         nested_dp.dist.json       DataParallel (8,)
    nested_frozen   nested_frozen  nested_frozen.dist.json   ModelParallel (2,4)  fine-tuning: a frozen
                                                             Sequential backbone in a Sequential
    conv1d          conv1d         conv1d.dist.json          ModelParallel (2,4)  Conv1D causal, same
                                                             (strided), valid; output channels split,
                                                             then input channels
    conv1d_dp       conv1d         conv1d_dp.dist.json       DataParallel (8,)
    dilated         dilated        dilated.dist.json         ModelParallel (2,4)  dilation_rate on Conv2D
                                                             (same; valid, width only) and Conv1D
                                                             (causal, same); channels split
    dilated_dp      dilated        dilated_dp.dist.json      DataParallel (8,)
    transposed      transposed     transposed.dist.json      ModelParallel (2,4)  Conv2DTranspose same
                                                             (strided) and valid (stride over the
                                                             kernel); filters split, then input
                                                             channels
    transposed_dp   transposed     transposed_dp.dist.json   DataParallel (8,)
    metrics         metrics        metrics.dist.json         ModelParallel (2,4)  Keras's metrics by
                                                             string and object on three heads
    metrics_dp      metrics        metrics_dp.dist.json      DataParallel (8,)
    lenet           lenet          lenet.dist.json           ModelParallel (2,4)  LeNet-5: ZeroPadding2D,
                                                             AveragePooling2D, tanh; filters and a
                                                             Megatron pair split
    lenet_dp        lenet          lenet_dp.dist.json        DataParallel (8,)
    mobilenet_mp    mobilenet      (DERIVED_CASES)           ModelParallel (2,4)  kdcc only, against
                                                             mobilenet_dp's numbers: every channel
                                                             dim split
    mobilenet_dp    mobilenet      mobilenet_dp.dist.json    DataParallel (8,)    MobileNet blocks:
                                                             depthwise-separable, an inverted
                                                             residual; batch norm, ReLU6
    activations     activations    activations.dist.json     ModelParallel (2,4)  LeakyReLU (0.3), ELU
                                                             (alpha 0.5), ReLU's max_value,
                                                             negative_slope, threshold; Megatron
                                                             pairs
    activations_dp  activations    activations_dp.dist.json  DataParallel (8,)
    glu             glu            glu.dist.json             ModelParallel (2,4)  glu as a Dense's
                                                             activation (its units split) and a
                                                             layer: the last dim halved (issue 25)
    loss_reg        loss_reg       loss_reg.dist.json        ModelParallel (2,4)  huber (delta 0.5),
                                                             log_cosh, poisson, cosine_similarity,
                                                             mape, msle, kl_divergence: a head
                                                             each, split on inputs or classes
    loss_reg_dp     loss_reg       loss_reg_dp.dist.json     DataParallel (8,)
    loss_cls        loss_cls       loss_cls.dist.json        ModelParallel (2,4)  hinge (0/1 labels,
                                                             then a -1 in a batch), squared_hinge,
                                                             categorical_hinge, label_smoothing on
                                                             the crossentropies (and from logits)
    loss_cls_dp     loss_cls       loss_cls_dp.dist.json     DataParallel (8,)
    merging         merging        merging.dist.json         ModelParallel (2,4)  Subtract, Maximum,
                                                             Minimum, Average, Dot (features, steps,
                                                             normalized); units split
    merging_dp      merging        merging_dp.dist.json      DataParallel (8,)
    norms_acts      norms_acts     norms_acts.dist.json      ModelParallel (2,4)  Softmax and LayerNorm
                                                             over other axes, UnitNormalization,
                                                             PReLU (shared_axes), ActivityRegularization,
                                                             RepeatVector; features split
    norms_acts_dp   norms_acts     norms_acts_dp.dist.json   DataParallel (8,)
    noise_norms     noise_norms    noise_norms.dist.json     ModelParallel (2,4)  GroupNormalization (rank
                                                             3 and 4), the noise layers (rates 0 here);
                                                             channels (groups) split
    noise_norms_dp  noise_norms    noise_norms_dp.dist.json  DataParallel (8,)
    conv1d_family   conv1d_family  conv1d_family.dist.json   ModelParallel (2,4)  DepthwiseConv1D,
                                                             SeparableConv1D (strided), Conv1DTranspose
                                                             (same, valid); filters split, then input
                                                             channels
    conv1d_family_dp conv1d_family conv1d_family_dp.dist.json DataParallel (8,)
    normalization   normalization  normalization.dist.json   ModelParallel (2,4)  Normalization (mean and
                                                             variance in the config: features, steps,
                                                             inverted, scalar); features split
    normalization_dp normalization normalization_dp.dist.json DataParallel (8,)
    adapted_norm    adapted_norm   adapted_norm.dist.json    ModelParallel (2,4)  Normalization adapted to
                                                             the training data (mean, variance,
                                                             count as weights: features, steps and
                                                             features, steps inverted, axis None,
                                                             after a Dense); statistics split
    adapted_norm_dp adapted_norm   adapted_norm_dp.dist.json DataParallel (8,)
    transposed_op   transposed_op  transposed_op.dist.json   ModelParallel (2,4)  output_padding of
                                                             Conv2DTranspose (same, valid) and
                                                             Conv1DTranspose (same, even kernel);
                                                             filters split, then input channels
    transposed_op_dp transposed_op transposed_op_dp.dist.json DataParallel (8,)
    lstm_text       lstm_text      lstm_text.dist.json       ModelParallel (2,4)  Embedding, LSTM, Dense;
                                                             the LSTM's kernels split on their units
    lstm_text_dp    lstm_text      lstm_text_dp.dist.json    DataParallel (8,)
    gru_text_dp     gru_text       gru_text_dp.dist.json     DataParallel (8,)    GRU (reset_after)
    gru_v1_text_dp  gru_v1_text    gru_v1_text_dp.dist.json  DataParallel (8,)    GRU reset_after=False
    bilstm_text_dp  bilstm_text    bilstm_text_dp.dist.json  DataParallel (8,)    stacked Bidirectional
                                                             LSTM (sequences, concat), GRU (mul),
                                                             its own backward_layer (ave)
    simple_rnn_seq_dp simple_rnn_seq simple_rnn_seq_dp.dist.json DataParallel (8,) SimpleRNN
                                                             sequences, then go_backwards
    rope            rope           rope.dist.json            ModelParallel (2,4)  keras_hub's
                                                             RotaryEmbedding on [b, t, 4, 8] heads;
                                                             a head a device
    rope_dp         rope           rope_dp.dist.json         DataParallel (8,)
    mixed_mlp, mixed_gpt, mixed_bn_cnn (and _dp)                  issue 23: mixed_bfloat16
    bf16_mlp, bf16_adam_mlp, bf16_cnn, bf16_bn_cnn, bf16_gpt (and _dp) issue 23: bfloat16 (variables
                                                             and slots too), with their
                                                             float32 and mixed_bfloat16 twins
    f16_mlp, f16_bn_cnn (and _dp)                                 issue 23: float16, no loss
                                                             scaling (Keras's compile adds
                                                             none), float32 and mixed twins
    bf16_rmsprop_mlp, bf16_nadam_mlp, bf16_adamax_reg,            issue 23: RMSprop (centered,
    bf16_lion_mlp, f16_adagrad_mlp (and _dp)                 momentum, clipnorm), Nadam
                                                             (global_clipnorm), Adamax
                                                             (clipvalue, regularizers and
                                                             constraints), Lion, Adagrad
                                                             (float16) on 16-bit variables
    bf16_unit_act (and _dp)                                       issue 23: UnitNorm over a
                                                             split dim and an activity
                                                             regularizer under bfloat16 (Adam)
    mixed_f16_mlp   mixed_f16_mlp  mixed_f16_mlp.dist.json   ModelParallel (2,4)  issue 23:
                                                             mixed_float16, compile's
                                                             LossScaleOptimizer; the third
                                                             batch's labels x1000 overflow its
                                                             float16 gradients: a skipped step
                                                             and a halved scale each epoch
    mixed_f16_mlp_dp mixed_f16_mlp mixed_f16_mlp_dp.dist.json DataParallel (8,)
    mixed_f16_growth_dp mixed_f16_growth (8,)                DataParallel (8,)    the same, compiled
                                                             with LossScaleOptimizer(Adam,
                                                             dynamic_growth_steps=3): the scale
                                                             halved, doubled, halved
    mixed_f16_bn_cnn mixed_f16_bn_cnn bn_cnn's (2,4) spec      ModelParallel (2,4)  bn_cnn under
                                                             mixed_float16: its own gradients
                                                             overflow (3 skipped steps), the
                                                             moving statistics move on
    mixed_f16_bn_cnn_dp mixed_f16_bn_cnn (8,)                DataParallel (8,)
    grouped_mp      grouped        (DERIVED_CASES)           ModelParallel (2,4)  kdcc only, against
                                                             grouped_dp's numbers: filters split
    grouped_dp      grouped        grouped_dp.dist.json      DataParallel (8,)    Conv2D groups,
                                                             DepthwiseConv2D (depth_multiplier 2,
                                                             strides 2), SeparableConv2D; no
                                                             ModelParallel case:
                                                             XLA aborts on a grouped conv under
                                                             the (2,4) mesh
    <opt case>      opt_<case>     <case>.dist.json          ModelParallel (2,4)  issue 11's optimizer
                                                             cases (make_models.OPT_CASES): one MLP,
                                                             the hidden columns split, compiled with
                                                             adam_amsgrad, rmsprop_centered, clipnorm,
                                                             clipvalue, global_clipnorm, adagrad,
                                                             adamax, nadam, lion (weight_decay),
                                                             sched_exp, sched_piecewise,
                                                             sched_cosine (warmup), sched_inverse,
                                                             sched_poly (cycle)
    global_clipnorm_dp opt_global_clipnorm global_clipnorm_dp.dist.json DataParallel (8,)

keras-hub's CausalLM tasks (hub_models.py, issue 24): tiny random models from
their hyper-parameters, inputs {token_ids, padding_mask} (padding_mask.npy,
token_ids.npy: Keras's input order), next-token labels, Adam(1e-3) with
keras-hub's default loss and weighted_metrics, and each model's preset/
(task.save_to_preset, the initial weights). Run only when named; written to
tests/fixtures/keras_hub/ (not keras_ref/) unless --out:

    hub_gpt2        hub_gpt2       hub_gpt2.dist.json        ModelParallel (2,4)  GPT2CausalLM, Megatron:
                                                             q/k/v heads, ffw, the tied
                                                             embedding's vocabulary split
    hub_gpt2_dp     hub_gpt2       hub_gpt2_dp.dist.json     DataParallel (8,)
    hub_llama       hub_llama      hub_llama.dist.json       ModelParallel (2,4)  LlamaCausalLM (8 query,
                                                             4 key/value heads) under
                                                             LlamaBackbone.get_layout_map, mesh
                                                             ('batch', 'model')
    hub_llama_dp    hub_llama      hub_llama_dp.dist.json    DataParallel (8,)
    hub_gemma       hub_gemma      hub_gemma.dist.json       ModelParallel (2,4)  GemmaCausalLM (4 query,
                                                             4 key/value heads) under
                                                             GemmaBackbone.get_layout_map, mesh
                                                             ('batch', 'model')
    hub_gemma_dp    hub_gemma      hub_gemma_dp.dist.json    DataParallel (8,)
    hub_mistral     hub_mistral    hub_mistral.dist.json     ModelParallel (2,4)  MistralCausalLM (8 query,
                                                             4 key/value heads, head_dim 6,
                                                             rope_scaling_factor 2, window 32)
                                                             under LlamaBackbone.get_layout_map
                                                             (Mistral has none)
    hub_mistral_dp  hub_mistral    hub_mistral_dp.dist.json  DataParallel (8,)
    hub_qwen        hub_qwen       hub_qwen.dist.json        ModelParallel (2,4)  QwenCausalLM (q/k/v biases
                                                             random at the start, tied head)
                                                             under QwenBackbone.get_layout_map
    hub_qwen_dp     hub_qwen       hub_qwen_dp.dist.json     DataParallel (8,)
    hub_llama3      hub_llama3     hub_llama3.dist.json      ModelParallel (2,4)  Llama3CausalLM (one block,
                                                             Llama 3.1's rope scaling) under
                                                             Llama3Backbone.get_layout_map
    hub_llama3_dp   hub_llama3     hub_llama3_dp.dist.json   DataParallel (8,)
    hub_qwen3       hub_qwen3      hub_qwen3.dist.json       ModelParallel (2,4)  Qwen3CausalLM (one block,
                                                             query/key norms, head_dim 8) under
                                                             LlamaBackbone.get_layout_map
    hub_qwen3_dp    hub_qwen3      hub_qwen3_dp.dist.json    DataParallel (8,)
    hub_gemma2      hub_gemma2     hub_gemma2.dist.json      ModelParallel (2,4)  GemmaCausalLM as Gemma 2
                                                             (4 query, 2 key/value heads, soft
                                                             caps 2.0 and 1.0, post norms) under
                                                             Gemma's map, key/value heads unsplit
    hub_gemma2_dp   hub_gemma2     hub_gemma2_dp.dist.json   DataParallel (8,)
    hub_gemma3      hub_gemma3     hub_gemma3.dist.json      ModelParallel (2,4)  Gemma3CausalLM (one local
                                                             block: window 4, query/key norms,
                                                             random norm scales) under Gemma's
                                                             map, key/value heads unsplit
    hub_gemma3_dp   hub_gemma3     hub_gemma3_dp.dist.json   DataParallel (8,)
    hub_llama_lora  hub_llama_lora hub_llama_lora.dist.json  ModelParallel (2,4)  hub_llama with
                                                             backbone.enable_lora(4) (not in
                                                             model.keras: --lora-rank 4), its
                                                             initial/final.lora.h5
    hub_llama_lora_dp hub_llama_lora hub_llama_lora_dp.dist.json DataParallel (8,)
    hub_gpt2_lora_dp hub_gpt2_lora hub_gpt2_lora_dp.dist.json DataParallel (8,)   hub_gpt2 with LoRA
                                                             (query/value biases train too)
    hub_gemma3_lora hub_gemma3_lora hub_gemma3_lora.dist.json ModelParallel (2,4) hub_gemma3 with
                                                             LoRA (its query/key norms numbered
                                                             before value, key and query)
    hub_gemma3_lora_dp hub_gemma3_lora hub_gemma3_lora_dp.dist.json DataParallel (8,)

and issue 23's 16-bit ones (hub_models.py's MIXED and BF16: the model built
with dtype="mixed_bfloat16" or "bfloat16", each with _dp), e.g. hub_qwen3_mixed,
hub_qwen3_bf16, hub_gemma3_mixed and hub_gemma3_bf16 (SGD with momentum, local
and global block), hub_gemma3_lora_bf16 (Gemma 3's LoRA in bfloat16).

Keras's own fit (FIT_CASES): partial batches and a batch size chosen at run
time. Each is trained twice from the same initial weights: once with
train_on_batch on the batches fit would make (every step's own loss, the
last batch of an epoch partial), once with model.fit(batch_size=...,
shuffle=False) and validation (validation_data, or validation_split:
Keras's last fraction), which gives the History (each epoch's logs, the
mean over samples, and the val_ logs); the two must end with the same
weights. Then model.evaluate on the validation data (what the training
program evaluates after fit) and the final weights.

    func_fit         func_branches  (2,4)  50 samples, batches of 16 (the last of 2),
                                           22 validation samples (16 + 6)
    func_fit_dp      func_branches  (8,)   the same, kdcc on 8 devices: the 2 rows over 8
    func_fit_split   func_branches  (2,4)  validation_split 0.2: 40 (16 + 16 + 8) and 10
    func_fit_b6      func_branches  (2,4)  compiled for 16, run with --batch-size 6 (8 steps,
                                           the last of 2; validation 6 + 6 + 6 + 4)
    func_fit_b6_dp   func_branches  (8,)   the same on 8 devices: every step's rows uneven
    func_fit_b24     func_branches  (2,4)  compiled for 16, run with --batch-size 24 (3 steps,
                                           the last of 2; validation 22): the arena replanned
    sched_fit_b6     opt_sched_cosine (2,4) CosineDecay with warmup, compiled for 16, run with
                                           --batch-size 6: the rate follows the steps
    nadam_fit        opt_nadam      (2,4)  Nadam over 3 epochs of partial batches
    two_heads_fit    two_heads      (2,4)  two outputs, per-output logs, a partial batch
    per_token_fit    per_token      (2,4)  a loss per token, averaged over every token
    per_token_fit_dp per_token      (8,)   the same on 8 devices
    func_fit_es      func_branches  (2,4)  EarlyStopping on loss (min_delta, restore_best_weights):
                                           7 of 10 epochs, epoch 6's weights restored
    func_fit_rlrop   func_branches  (2,4)  ReduceLROnPlateau (factor, cooldown, min_lr) and
                                           EarlyStopping on val_loss: the History's learning_rate
    func_fit_best    func_branches  (2,4)  EarlyStopping on val_accuracy (baseline,
                                           start_from_epoch) and ModelCheckpoint(save_best_only)

Cases with callbacks run fit first; the train_on_batch run drives the same
callback objects on fit's epoch logs (stop_training, learning_rate), and
fit also runs ModelCheckpoint (<case>.best.npz: the weights it kept) and
CSVLogger (<case>.csv), kdcc's --checkpoint-best and --csv-log.

Keras itself cannot split 2 rows over 8 devices (IndivisibleError): for a
case whose kdcc mesh is (8,), Keras ran under the case's keras_distribution
(the (2,4) one); the numbers do not depend on the mesh. These cases live
in OUT/<model>_fit/ (their own data: 72 samples, the first 50 to train,
the last 22 to validate: x.npy, y.npy, val_x.npy, val_y.npy, or x0.npy,
val_x0.npy, ... with several inputs), and their JSON says:
    compile_batch_size   kdcc's --batch-size (batch_size: the run's)
    validation           {"data": 22} or {"split": 0.2}
    keras_distribution   the spec Keras ran under
    epoch_logs           fit's History (val_ logs included)
    program_args         the whole command line, files relative to the folder

The models are the Python builders of make_models.py with every Dropout rate
set to 0 before anything runs (Keras's and kdcc's dropout RNGs differ), so
the saved config says rate 0.0. Per case the model is built under the
distribution from keras.utils.set_random_seed(1234) and trained with
train_on_batch on the batches of 16 in file order (no shuffling), 8 steps
(DATA below: samples and epochs per model). train_on_batch resets the metrics
first, so each returned loss is that step's own loss, not a running mean.

Written under OUT/<model>/ (the cases of one model share model and data):

    model.keras       the model with its initial weights (before any step)
    x.npy, y.npy      the samples, in training order; a model with several
                      inputs has x0.npy, x1.npy, ... (model.inputs order), one
                      with several outputs y0.npy, y1.npy, ... (model.outputs
                      order); int inputs and class-id labels are int32
    final.npz         the trained weights, one array per model.weights.h5
                      path (layers/dense/vars/0, ...; optimizer state left
                      out), deflated
    <case>.dist.json  the distribution spec
    <case>.json       step_loss (every train step, in order), epoch_loss (the
                      mean per epoch, what History records), evaluate
                      (model.evaluate on x after training), the metric, the
                      command line kdcc's program needs, and which final.npz
                      holds the case's weights (the second seed_mlp case uses
                      the first one's when they agree within 2e-5: the math
                      is the same, only the layout differs), and:
                        inputs   [{name (the InputLayer's), shape (per sample),
                                 dtype, file}] in model.inputs order
                        outputs  [{name (the output layer's), shape, loss,
                                 loss_weight, labels_file, labels_shape,
                                 labels_dtype}] in model.outputs order
                        x_files, y_files   the data files, in that order
                        step_logs {log: [every step]}: every log
                                 train_on_batch returned ("loss", the
                                 weighted total; "<output>_loss" per output
                                 when there are several; "accuracy" or
                                 "<output>_accuracy")
                        epoch_logs {log: [mean per epoch]}, what History has
                        kdcc_args, program_args   kdcc's and the training
                                 program's arguments (files relative to the
                                 case's folder): one --x per input, one --y per
                                 output, in order; program_args_named: the same
                                 as --x NAME=FILE / --y NAME=FILE
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _here)

import make_models as mm  # noqa: E402  (sets KERAS_BACKEND, XLA_FLAGS: 8 devices)
import hub_models as hub  # noqa: E402  (issue 24's keras-hub cases)

import argparse  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import zipfile  # noqa: E402

import h5py  # noqa: E402
import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

ROOT = mm.ROOT
FIXTURES = os.path.join(ROOT, "tests", "fixtures", "keras_ref")
BATCH = 16

# model -> (samples, epochs): 8 train steps of 16 each. The 28x28 models get
# one batch (8 epochs over it) to keep the fixtures under 2 MB (seed_mlp's
# weights alone are 627 KB, twice: initial and final); the others get four
# batches, so the order of batches is checked too.
DATA = {
    "seed_mlp": (16, 8),
    "func_branches": (64, 2),
    "cnn": (16, 8),
    "megatron": (64, 2),
    "wide_deep": (64, 2),
    "two_heads": (64, 2),
    "metrics": (64, 2),
    "int_tokens": (64, 2),
    "per_token": (64, 2),
    "shared_dense": (64, 2),
    "text_cls": (64, 2),
    "gpt": (64, 2),
    "vit": (64, 2),
    "llama": (64, 2),
    "bn_cnn": (64, 2),
    "einsum": (64, 2),
    "rev_emb": (64, 2),
    "attn_mask": (64, 2),
    "regularized": (64, 2),
    "constrained": (64, 2),
    "frozen": (64, 2),
    "nested": (64, 2),
    "nested_frozen": (64, 2),
    "conv1d": (64, 2),
    "dilated": (64, 2),
    "grouped": (64, 2),
    "transposed": (64, 2),
    "lenet": (64, 2),
    "mobilenet": (64, 2),
    "activations": (64, 2),
    "glu": (64, 2),
    "loss_reg": (64, 2),
    "loss_cls": (64, 2),
    **{"opt_" + case: (64, 2) for case in mm.OPT_CASES},
    "merging": (64, 2),
    "norms_acts": (64, 2),
    "noise_norms": (64, 2),
    "conv1d_family": (64, 2),
    "normalization": (64, 2),
    "adapted_norm": (64, 2),  # make_models.adapted_norm adapts to these 64 samples
    "transposed_op": (64, 2),
    "lstm_text": (64, 2),
    "gru_text": (64, 2),
    "gru_v1_text": (64, 2),
    "bilstm_text": (64, 2),
    "simple_rnn_seq": (64, 2),
    "rope": (64, 2),
    "mixed_mlp": (64, 2),
    "mixed_gpt": (64, 2),
    "mixed_bn_cnn": (64, 2),
    "mixed_f16_mlp": (64, 2),
    "bf16_mlp": (64, 2),
    "bf16_adam_mlp": (64, 2),
    "bf16_cnn": (64, 2),
    "bf16_bn_cnn": (64, 2),
    "bf16_gpt": (64, 2),
    "f16_mlp": (64, 2),
    "bf16_rmsprop_mlp": (64, 2),
    "bf16_nadam_mlp": (64, 2),
    "bf16_adamax_reg": (64, 2),
    "bf16_unit_act": (64, 2),
    "bf16_lion_mlp": (64, 2),
    "f16_adagrad_mlp": (64, 2),
    "f16_bn_cnn": (64, 2),
    "mixed_f16_growth": (64, 2),
    "mixed_f16_bn_cnn": (64, 2),
}

# Fit cases: case -> (model, kdcc's dist spec, Keras's dist spec, settings).
# Spec names are make_models.py's (a model's "dists"); "dp8" is DataParallel
# over 8 devices.
FIT_DATA = (50, 22)  # training samples, then validation samples, of one stream
FIT_CASES = {
    "func_fit": ("func_branches", "func_branches", "func_branches",
                 dict(batch=16, epochs=2, val="data")),
    "func_fit_dp": ("func_branches", "dp8", "func_branches",
                    dict(batch=16, epochs=2, val="data")),
    "func_fit_split": ("func_branches", "func_branches", "func_branches",
                       dict(batch=16, epochs=2, val=0.2)),
    "func_fit_b6": ("func_branches", "func_branches", "func_branches",
                    dict(batch=6, compile_batch=16, epochs=2, val="data")),
    "func_fit_b6_dp": ("func_branches", "dp8", "func_branches",
                       dict(batch=6, compile_batch=16, epochs=2, val="data")),
    # more rows than compiled for: the program replays its memory plan
    "func_fit_b24": ("func_branches", "func_branches", "func_branches",
                     dict(batch=24, compile_batch=16, epochs=2, val="data")),
    # issue 11: a schedule and Nadam under fit: batches of 6 (the last of 2
    # rows), so the step count, which the rate and Nadam's product follow,
    # runs over partial batches
    "sched_fit_b6": ("opt_sched_cosine", "sched_cosine", "sched_cosine",
                     dict(batch=6, compile_batch=16, epochs=2, val="data")),
    "nadam_fit": ("opt_nadam", "nadam", "nadam", dict(batch=16, epochs=3, val="data")),
    "two_heads_fit": ("two_heads", "two_heads", "two_heads",
                      dict(batch=16, epochs=2, val="data")),
    "per_token_fit": ("per_token", "per_token", "per_token",
                      dict(batch=16, epochs=2, val="data")),
    "per_token_fit_dp": ("per_token", "per_token_dp", "per_token",
                         dict(batch=16, epochs=2, val="data")),
    # Keras's callbacks (kdcc's run-time flags), set to act within a few
    # epochs with wide margins. The training loss falls by 0.148, 0.147,
    # 0.147, 0.140, 0.122, then 0.101 < min_delta: EarlyStopping stops
    # after epoch 7 and restores epoch 6's weights.
    "func_fit_es": ("func_branches", "func_branches", "func_branches",
                    dict(batch=16, epochs=10, val="data", lr=0.01,
                         callbacks=dict(early_stopping=dict(
                             monitor="loss", min_delta=0.11, patience=1,
                             restore_best_weights=True)))),
    # val_loss rises from the first epoch on (random labels): the learning
    # rate halves after epochs 2, 3 and 4 (cooldown 1; the last reduction
    # stops at min_lr 0.002), and EarlyStopping (patience 3, never
    # improved) stops after epoch 4.
    "func_fit_rlrop": ("func_branches", "func_branches", "func_branches",
                       dict(batch=16, epochs=8, val="data", lr=0.01,
                            callbacks=dict(
                                reduce_lr=dict(factor=0.5, patience=1, cooldown=1,
                                               min_lr=0.002),
                                early_stopping=dict(patience=3)))),
    # val_accuracy (max mode) from epoch 2 on, with a baseline: it is not
    # beaten until epoch 4, so EarlyStopping's wait runs on through the
    # first improvements; ModelCheckpoint(save_best_only) keeps the best
    # epoch's weights, which kdcc's --checkpoint-best must equal.
    "func_fit_best": ("func_branches", "func_branches", "func_branches",
                      dict(batch=16, epochs=10, val="data", lr=0.01,
                           callbacks=dict(
                               early_stopping=dict(monitor="val_accuracy", patience=2,
                                                   baseline=0.25, start_from_epoch=1,
                                                   restore_best_weights=True),
                               checkpoint_best=dict(monitor="val_accuracy")))),
}


def make_callbacks(cfg):
    """The Keras callbacks of a fit case, in the order kdcc runs them."""
    cb = cfg.get("callbacks", {})
    out = []
    if "reduce_lr" in cb:
        out.append(keras.callbacks.ReduceLROnPlateau(**cb["reduce_lr"]))
    if "early_stopping" in cb:
        out.append(keras.callbacks.EarlyStopping(**cb["early_stopping"]))
    return out


def callback_args(cfg):
    """kdcc's flags for the same callbacks."""
    cb, args = cfg.get("callbacks", {}), []
    if "lr" in cfg:
        args += ["--lr", repr(cfg["lr"])]
    rl = cb.get("reduce_lr")
    if rl:
        args += ["--reduce-lr-on-plateau", str(rl["patience"])]
        for k in ("factor", "cooldown", "min_lr", "min_delta"):
            if k in rl:
                flag = "--min-lr" if k == "min_lr" else "--reduce-lr-" + k.replace("_", "-")
                args += [flag, repr(rl[k])]
    es = cb.get("early_stopping")
    if es:
        args += ["--early-stopping", str(es["patience"])]
        if "min_delta" in es:
            args += ["--min-delta", repr(es["min_delta"])]
        for k in ("baseline", "start_from_epoch"):
            if k in es:
                args += ["--" + k.replace("_", "-"), repr(es[k])]
        if es.get("restore_best_weights"):
            args += ["--restore-best-weights"]
    monitors = {d.get("monitor", "val_loss") for d in cb.values()}
    assert len(monitors) <= 1, "kdcc's callbacks share one --monitor"
    if monitors and monitors != {"val_loss"}:
        args += ["--monitor", monitors.pop()]
    return args

# case -> (model, dist spec stem in models/)
CASES = {
    "seed_mlp_dp": ("seed_mlp", "seed_mlp_dp"),
    "seed_mlp_mp": ("seed_mlp", "seed_mlp_fixed"),
    "func_branches": ("func_branches", "func_branches"),
    "cnn": ("cnn", "cnn"),
    "megatron": ("megatron", "megatron"),
    "wide_deep": ("wide_deep", "wide_deep"),
    "wide_deep_dp": ("wide_deep", "wide_deep_dp"),
    "two_heads": ("two_heads", "two_heads"),
    "two_heads_dp": ("two_heads", "two_heads_dp"),
    "int_tokens": ("int_tokens", "int_tokens"),
    "int_tokens_dim": ("int_tokens", "int_tokens_dim"),
    "int_tokens_dp": ("int_tokens", "int_tokens_dp"),
    "per_token": ("per_token", "per_token"),
    "per_token_dp": ("per_token", "per_token_dp"),
    "shared_dense": ("shared_dense", "shared_dense"),
    "shared_dense_dp": ("shared_dense", "shared_dense_dp"),
    "text_cls": ("text_cls", "text_cls"),
    "text_cls_dp": ("text_cls", "text_cls_dp"),
    "gpt": ("gpt", "gpt"),
    "gpt_fsdp": ("gpt", "gpt_fsdp"),
    "gpt_dp": ("gpt", "gpt_dp"),
    "vit": ("vit", "vit"),
    "vit_dp": ("vit", "vit_dp"),
    "llama": ("llama", "llama"),
    "llama_dp": ("llama", "llama_dp"),
    "bn_cnn": ("bn_cnn", "bn_cnn"),
    "bn_cnn_dp": ("bn_cnn", "bn_cnn_dp"),
    "einsum": ("einsum", "einsum"),
    "einsum_dp": ("einsum", "einsum_dp"),
    "rev_emb": ("rev_emb", "rev_emb"),
    "rev_emb_dp": ("rev_emb", "rev_emb_dp"),
    "attn_mask": ("attn_mask", "attn_mask"),
    "attn_mask_dp": ("attn_mask", "attn_mask_dp"),
    "regularized": ("regularized", "regularized"),
    "regularized_dp": ("regularized", "regularized_dp"),
    "constrained": ("constrained", "constrained"),
    "constrained_dp": ("constrained", "constrained_dp"),
    "frozen": ("frozen", "frozen"),
    "frozen_dp": ("frozen", "frozen_dp"),
    "nested": ("nested", "nested"),
    "nested_dp": ("nested", "nested_dp"),
    "nested_frozen": ("nested_frozen", "nested_frozen"),
    "conv1d": ("conv1d", "conv1d"),
    "conv1d_dp": ("conv1d", "conv1d_dp"),
    "dilated": ("dilated", "dilated"),
    "dilated_dp": ("dilated", "dilated_dp"),
    "grouped_dp": ("grouped", "grouped_dp"),
    "transposed": ("transposed", "transposed"),
    "transposed_dp": ("transposed", "transposed_dp"),
    "lenet": ("lenet", "lenet"),
    "lenet_dp": ("lenet", "lenet_dp"),
    "mobilenet_dp": ("mobilenet", "mobilenet_dp"),
    "metrics": ("metrics", "metrics"),
    "metrics_dp": ("metrics", "metrics_dp"),
    "activations": ("activations", "activations"),
    "activations_dp": ("activations", "activations_dp"),
    "glu": ("glu", "glu"),  # issue 25
    "loss_reg": ("loss_reg", "loss_reg"),
    "loss_reg_dp": ("loss_reg", "loss_reg_dp"),
    "loss_cls": ("loss_cls", "loss_cls"),
    "loss_cls_dp": ("loss_cls", "loss_cls_dp"),
    # issue 11's optimizer options, optimizers and schedules (opt_mlp)
    **{case: ("opt_" + case, case) for case in mm.OPT_CASES},
    "global_clipnorm_dp": ("opt_global_clipnorm", "global_clipnorm_dp"),
    "merging": ("merging", "merging"),
    "merging_dp": ("merging", "merging_dp"),
    "norms_acts": ("norms_acts", "norms_acts"),
    "norms_acts_dp": ("norms_acts", "norms_acts_dp"),
    "noise_norms": ("noise_norms", "noise_norms"),
    "noise_norms_dp": ("noise_norms", "noise_norms_dp"),
    "conv1d_family": ("conv1d_family", "conv1d_family"),
    "conv1d_family_dp": ("conv1d_family", "conv1d_family_dp"),
    "normalization": ("normalization", "normalization"),
    "normalization_dp": ("normalization", "normalization_dp"),
    "adapted_norm": ("adapted_norm", "adapted_norm"),
    "adapted_norm_dp": ("adapted_norm", "adapted_norm_dp"),
    "transposed_op": ("transposed_op", "transposed_op"),
    "transposed_op_dp": ("transposed_op", "transposed_op_dp"),
    "lstm_text": ("lstm_text", "lstm_text"),
    "lstm_text_dp": ("lstm_text", "lstm_text_dp"),
    "gru_text_dp": ("gru_text", "gru_text_dp"),
    "gru_v1_text_dp": ("gru_v1_text", "gru_v1_text_dp"),
    "bilstm_text_dp": ("bilstm_text", "bilstm_text_dp"),
    "simple_rnn_seq_dp": ("simple_rnn_seq", "simple_rnn_seq_dp"),
    "rope": ("rope", "rope"),
    "rope_dp": ("rope", "rope_dp"),
    # issue 23: mixed_bfloat16 (make_models.py's under_policy)
    "mixed_mlp": ("mixed_mlp", "mixed_mlp"),
    "mixed_mlp_dp": ("mixed_mlp", "mixed_mlp_dp"),
    "mixed_gpt": ("mixed_gpt", "mixed_gpt"),
    "mixed_gpt_dp": ("mixed_gpt", "mixed_gpt_dp"),
    "mixed_bn_cnn": ("mixed_bn_cnn", "mixed_bn_cnn"),
    "mixed_bn_cnn_dp": ("mixed_bn_cnn", "mixed_bn_cnn_dp"),
    # the pure bfloat16 policy: variables and slots in bfloat16
    "bf16_mlp": ("bf16_mlp", "bf16_mlp"),
    "bf16_mlp_dp": ("bf16_mlp", "bf16_mlp_dp"),
    "bf16_adam_mlp": ("bf16_adam_mlp", "bf16_adam_mlp"),
    "bf16_adam_mlp_dp": ("bf16_adam_mlp", "bf16_adam_mlp_dp"),
    "bf16_cnn": ("bf16_cnn", "bf16_cnn"),
    "bf16_cnn_dp": ("bf16_cnn", "bf16_cnn_dp"),
    "bf16_bn_cnn": ("bf16_bn_cnn", "bf16_bn_cnn"),
    "bf16_bn_cnn_dp": ("bf16_bn_cnn", "bf16_bn_cnn_dp"),
    "bf16_gpt": ("bf16_gpt", "bf16_gpt"),
    "bf16_gpt_dp": ("bf16_gpt", "bf16_gpt_dp"),
    "f16_mlp": ("f16_mlp", "f16_mlp"),
    "f16_mlp_dp": ("f16_mlp", "f16_mlp_dp"),
    # issue 23: the other optimizers, clipping, regularizers and constraints in 16 bits
    "bf16_rmsprop_mlp": ("bf16_rmsprop_mlp", "bf16_rmsprop_mlp"),
    "bf16_rmsprop_mlp_dp": ("bf16_rmsprop_mlp", "bf16_rmsprop_mlp_dp"),
    "bf16_nadam_mlp": ("bf16_nadam_mlp", "bf16_nadam_mlp"),
    "bf16_nadam_mlp_dp": ("bf16_nadam_mlp", "bf16_nadam_mlp_dp"),
    "bf16_adamax_reg": ("bf16_adamax_reg", "bf16_adamax_reg"),
    "bf16_adamax_reg_dp": ("bf16_adamax_reg", "bf16_adamax_reg_dp"),
    "bf16_unit_act": ("bf16_unit_act", "bf16_unit_act"),
    "bf16_unit_act_dp": ("bf16_unit_act", "bf16_unit_act_dp"),
    "bf16_lion_mlp": ("bf16_lion_mlp", "bf16_lion_mlp"),
    "bf16_lion_mlp_dp": ("bf16_lion_mlp", "bf16_lion_mlp_dp"),
    "f16_adagrad_mlp": ("f16_adagrad_mlp", "f16_adagrad_mlp"),
    "f16_adagrad_mlp_dp": ("f16_adagrad_mlp", "f16_adagrad_mlp_dp"),
    "f16_bn_cnn": ("f16_bn_cnn", "f16_bn_cnn"),
    "f16_bn_cnn_dp": ("f16_bn_cnn", "f16_bn_cnn_dp"),
    # mixed_float16, with Keras's LossScaleOptimizer
    "mixed_f16_mlp": ("mixed_f16_mlp", "mixed_f16_mlp"),
    "mixed_f16_mlp_dp": ("mixed_f16_mlp", "mixed_f16_mlp_dp"),
    "mixed_f16_growth_dp": ("mixed_f16_growth", "mixed_f16_growth_dp"),
    "mixed_f16_bn_cnn": ("mixed_f16_bn_cnn", "mixed_f16_bn_cnn"),
    "mixed_f16_bn_cnn_dp": ("mixed_f16_bn_cnn", "mixed_f16_bn_cnn_dp"),
}

# issue 23: how close a mixed-precision case must be. XLA keeps some fused
# 16-bit chains in float32, so where Keras rounds is not unique; an honest
# implementation differs from Keras by up to ~1e-3 here: each loss within
# MIXED_RTOL relative, the training update (final minus initial weights)
# within MIXED_UPDATE_RTOL (relative, in norm, per tensor), and the losses
# at least MIXED_FROM_F32 times Keras's own mixed-to-float32 distance away
# from Keras's float32 run from the same weights (so that a run that
# skipped the rounding fails).
MIXED_RTOL, MIXED_UPDATE_RTOL, MIXED_FROM_F32 = 1e-2, 0.1, 0.2
# A bfloat16 (float16) model's variables move by whole 16-bit steps: Adam's steps
# of 1e-2 are 1 to 3 of them on a LayerNormalization's gamma near 1, where
# a rounding decided the other way moves a tensor's update by a sixth.
PURE_UPDATE_RTOL = 0.2


def float32_losses(model_name, keras_path, xs, ys, n, epochs, skipped=(),
                   twin_key="float32_twin"):
    """issue 23: every step's loss of the model's float32 twin (twin_key: or
    another) trained from the mixed model's initial weights (keras_path), as the case trains; a
    step the mixed run's loss scale skipped (`skipped`, by index) is not
    trained on either, and its loss is None (no float32 counterpart to
    compare: the forward pass alone, here of labels 1000 times larger)."""
    twin = mm.MODELS[model_name][twin_key]()
    zero_dropout(twin)
    twin.load_weights(keras_path)
    losses = []
    for _ in range(epochs):
        for s in range(n // BATCH):
            sl = slice(s * BATCH, (s + 1) * BATCH)
            if len(losses) in skipped:
                losses.append(None)
                continue
            logs = twin.train_on_batch(one_or_list(xs, sl), one_or_list(ys, sl),
                                       return_dict=True)
            losses.append(float(logs["loss"]))
    return losses


def make_data(model_name, n):
    """([x per model input], [y per output with a loss], x files, y files):
    rng seed 0, float inputs normal, int inputs ids in [0, vocabulary),
    labels of each output's kind. One input (output): x.npy (y.npy); several:
    x0.npy, x1.npy, ... (y0.npy, ...) in model.inputs (model.outputs) order."""
    x, y = mm.fake_data(mm.MODELS[model_name], n)
    xs = x if isinstance(x, list) else [x]
    ys = y if isinstance(y, list) else [y]
    xf = ["x.npy"] if len(xs) == 1 else [f"x{i}.npy" for i in range(len(xs))]
    yf = ["y.npy"] if len(ys) == 1 else [f"y{i}.npy" for i in range(len(ys))]
    return xs, ys, xf, yf


def one_or_list(arrays, sl=slice(None)):
    """What Keras takes for one input (output): the array; for several: the
    list, in model order."""
    if len(arrays) == 1:
        return arrays[0][sl]
    return [a[sl] for a in arrays]


def loss_name(loss):
    """A compile_config loss (string or envelope) as one string."""
    if isinstance(loss, str) or loss is None:
        return loss
    cfg = loss.get("config", {})
    if isinstance(cfg, str):  # a function: its name
        return cfg
    extra = ", from_logits=True" if cfg.get("from_logits") else ""
    for k in ("label_smoothing", "delta"):  # issue 11
        if cfg.get(k):
            extra += f", {k}={cfg[k]}"
    return f"{loss['class_name']}({cfg.get('name', '')}{extra})"


def io_description(model, xs, ys, xf, yf):
    """The case JSON's "inputs" and "outputs": names (InputLayer / output
    layer), per-sample shapes, dtypes, files, and each output's loss and
    loss weight as compiled."""
    in_names = [t._keras_history[0].name for t in model.inputs]
    out_names = [t._keras_history[0].name for t in model.outputs]
    assert len(in_names) == len(xs) and len(out_names) == len(ys), (in_names, out_names)
    cc = model.get_compile_config()  # serialized: strings or envelopes
    loss, weights = cc["loss"], cc.get("loss_weights")
    inputs = [{"name": nm, "shape": list(a.shape[1:]), "dtype": str(a.dtype), "file": f}
              for nm, a, f in zip(in_names, xs, xf)]
    outputs = []
    if isinstance(loss, dict) and "class_name" in loss:  # one loss envelope
        loss = [loss] * len(out_names)
    for i, (nm, a, f) in enumerate(zip(out_names, ys, yf)):
        lo = loss.get(nm) if isinstance(loss, dict) else (
            loss[i] if isinstance(loss, list) else loss)
        w = weights.get(nm) if isinstance(weights, dict) else (
            weights[i] if isinstance(weights, list) else None)
        outputs.append({
            "name": nm,
            "shape": list(model.outputs[i].shape[1:]),
            "loss": loss_name(lo),
            "loss_weight": 1.0 if w is None else float(w),
            "labels_file": f,
            "labels_shape": list(a.shape[1:]),
            "labels_dtype": str(a.dtype),
        })
    return inputs, outputs


def zero_dropout(model):
    """Dropout (SpatialDropout's too) and the noise layers off: Keras's draws
    are not kdcc's (those are checked by mesh_equiv.sh and noise_identity.sh)."""
    for layer in model.layers:
        if isinstance(layer, (keras.layers.Dropout, keras.layers.GaussianDropout)):
            layer.rate = 0.0
        if isinstance(layer, keras.layers.GaussianNoise):
            layer.stddev = 0.0


def layer_weights(path):
    """{h5 path: array} of every variable under layers/ in a .weights.h5."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and name.startswith("layers/"):
                out[name] = np.array(obj)
                if obj.attrs.get("dtype") == "bfloat16":  # issue 23: Keras's 2-byte opaque data
                    bits = out[name].view(np.uint16).astype(np.uint32) << 16
                    out[name] = bits.view(np.float32)
                elif out[name].dtype == np.float16:  # issue 23: a float16 variable
                    out[name] = out[name].astype(np.float32)
        f.visititems(visit)
    return out


def archive_weights(path):
    with zipfile.ZipFile(path) as z, tempfile.TemporaryDirectory() as d:
        z.extract("model.weights.h5", d)
        return layer_weights(os.path.join(d, "model.weights.h5"))


def max_rel(a, b):
    """max |a-b| / max(|b|) over one tensor (the tensor's scale, so weights
    near zero do not blow the ratio up)."""
    scale = max(float(np.max(np.abs(b))), 1e-12)
    return float(np.max(np.abs(a - b))) / scale


# Weights whose gradient is zero in exact arithmetic: an attention layer's
# key bias adds q.b_k to every logit of a query's row, and softmax is
# invariant to that shift. Keras's gradient for them is rounding noise
# (~1e-9) that Adam divides by sqrt(v) + 1e-7, so their trained values
# (~1e-6, from zero) are noise no other implementation can reproduce; they do
# not change any loss. Such a tensor is checked absolutely instead: within
# the learning rate times the number of steps (a bound on Adam's updates).
NOISE_WEIGHTS = re.compile(
    r"layers/(multi_head_attention|grouped_query_attention)(_\d+)?/_?key_dense/vars/1")


def noise_atol(final, lr, steps):
    """{h5 path: absolute tolerance} of the weights NOISE_WEIGHTS names."""
    return {k: lr * steps for k in sorted(final) if NOISE_WEIGHTS.fullmatch(k)}


def weights_diff(a, b, atol):
    """(worst max_rel over the tensors not in atol, the atol tensors within
    their absolute tolerance?)"""
    worst = max([0.0] + [max_rel(a[k], b[k]) for k in b if k not in atol])
    ok = all(float(np.max(np.abs(a[k] - b[k]))) <= t for k, t in atol.items())
    return worst, ok


def train_step_hlo(model, x, y):
    """The optimized HLO of the train step Keras compiles for this model
    under the current distribution: the same jit (train_step, donated state,
    out_shardings from the variables) as JAXTrainer.make_train_function,
    lowered on the state and batch train_on_batch would pass."""
    from keras.src.backend.jax import trainer as jt

    data = jt._distribute_data((x, y, None))
    state = model._get_jax_state(trainable_variables=True,
                                 non_trainable_variables=True,
                                 optimizer_variables=True,
                                 metrics_variables=True,
                                 purge_model_variables=False)
    out_shardings = (None, model._get_state_sharding_spec())
    f = jax.jit(model.train_step, donate_argnums=0, out_shardings=out_shardings)
    return f.lower(state, data).compile().as_text()


def program_args(xf, yf, in_names, out_names, epochs):
    """The training program's arguments for a case (files relative to the
    case's folder): one --x per model input and one --y per output with a
    loss, in model order, or NAME=FILE with the InputLayer / output layer
    names."""
    args = []
    for flag, files, names in (("--x", xf, in_names), ("--y", yf, out_names)):
        for i, f in enumerate(files):
            args += [flag, f if names is None else f"{names[i]}={f}"]
    return args + ["--epochs", str(epochs), "--batch-size", str(BATCH), "--no-shuffle",
                   "--weights", "model.keras"]


def write_final(mdir, case, model_name, final, atol, spec):
    """A case's final weights and its spec, into mdir: final.npz, shared with
    the model's first case when the weights equal it (within 2e-5 of each
    tensor's max, key biases within atol), else <case>.final.npz; and
    <case>.dist.json. Returns (the weights' file, a note or None)."""
    final_name, note = "final.npz", None
    fpath = os.path.join(mdir, final_name)
    if os.path.exists(fpath):
        prev = dict(np.load(fpath))
        worst, noise_ok = weights_diff(final, prev, atol) if prev.keys() == final.keys() \
            else (float("inf"), False)
        if prev.keys() == final.keys() and worst <= 2e-5 and noise_ok:
            note = (f"same as the first case of {model_name} within "
                    f"{worst:.1e} (relative to each tensor's max)")
        else:
            final_name = case + ".final.npz"
            fpath = os.path.join(mdir, final_name)
    if note is None:
        np.savez_compressed(fpath, **final)
    with open(os.path.join(mdir, case + ".dist.json"), "w") as f:
        json.dump(spec, f, indent=2)
        f.write("\n")
    return final_name, note


def finish_ref(mdir, case, ref, atol):
    """The case's JSON (ref, then the key biases' absolute tolerances atol),
    written to mdir/<case>.json, and a line saying what Keras did."""
    if atol:
        ref["final_weights_atol"] = atol
        ref["final_weights_atol_note"] = (
            "attention key biases: zero gradient in exact arithmetic (softmax "
            "is shift invariant), Keras's values are Adam-amplified rounding "
            "noise; checked as |kdcc - keras| <= this absolute tolerance "
            "(learning rate * steps) instead of relative to the tensor")
    with open(os.path.join(mdir, case + ".json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    step_loss, note = ref["step_loss"], ref.get("final_weights_note")
    print(f"{case}: {len(step_loss)} steps, loss {step_loss[0]:.6f} -> "
          f"{step_loss[-1]:.6f}, evaluate {ref['evaluate']}, weights {ref['final_weights']}"
          + (f" ({note})" if note else ""))
    return ref


def run_case(case, out, hlo):
    model_name, dist_name = CASES[case]
    n, epochs = DATA[model_name]
    spec = mm.MODELS[model_name]["dists"][dist_name]
    mdir = os.path.join(out, model_name)
    os.makedirs(mdir, exist_ok=True)

    keras.backend.clear_session()
    keras.utils.set_random_seed(mm.SEED)
    distribution = mm.make_distribution(spec)
    keras.distribution.set_distribution(distribution)
    try:
        model = mm.MODELS[model_name]["build"]()
        zero_dropout(model)
        xs, ys, xf, yf = make_data(model_name, n)
        inputs, outputs = io_description(model, xs, ys, xf, yf)
        # The model is built (Input given); save its initial weights.
        keras_path = os.path.join(mdir, "model.keras")
        if not os.path.exists(keras_path):
            mm.save_archive(model, keras_path, True)
            for a, f in zip(xs + ys, xf + yf):
                np.save(os.path.join(mdir, f), a)
        else:  # a second case of the model: same initial weights, same data
            with tempfile.TemporaryDirectory() as d:
                mm.save_archive(model, os.path.join(d, "m.keras"), True)
                mine = archive_weights(os.path.join(d, "m.keras"))
            theirs = archive_weights(keras_path)
            assert mine.keys() == theirs.keys(), (mine.keys(), theirs.keys())
            for k in mine:
                assert np.array_equal(mine[k], theirs[k]), f"{case}: initial {k} differs"
            for a, f in zip(xs + ys, xf + yf):
                assert np.array_equal(np.load(os.path.join(mdir, f)), a), f"{case}: {f} differs"

        metric = None
        step_loss, step_metric = [], []
        step_logs = {}
        # issue 23: a LossScaleOptimizer's scale after each step, and the
        # steps it skipped (the optimizer's iterations did not move)
        scaled = isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
        step_scale, skipped = [], []
        for _ in range(epochs):
            for s in range(n // BATCH):
                sl = slice(s * BATCH, (s + 1) * BATCH)
                before = int(model.optimizer.iterations.numpy()) if model.optimizer.built else 0
                logs = model.train_on_batch(one_or_list(xs, sl), one_or_list(ys, sl),
                                            return_dict=True)
                if scaled:
                    step_scale.append(float(model.optimizer.dynamic_scale.numpy()))
                    if int(model.optimizer.iterations.numpy()) == before:
                        skipped.append(len(step_loss))
                step_loss.append(float(logs["loss"]))
                for k, v in logs.items():
                    step_logs.setdefault(k, []).append(float(v))
                # The metric: the first log that is no loss (per-output
                # losses are "<output>_loss").
                others = [k for k in logs if k != "loss" and not k.endswith("_loss")]
                if others:
                    metric = others[0]
                    step_metric.append(float(logs[metric]))
        if hlo:  # the optimizer is built now
            text = train_step_hlo(model, one_or_list(xs, slice(0, BATCH)),
                                  one_or_list(ys, slice(0, BATCH)))
            with open(os.path.join(out, case + ".hlo.txt"), "w") as f:
                f.write(text)
        spe = n // BATCH
        epoch_loss = [float(np.mean(step_loss[e * spe:(e + 1) * spe]))
                      for e in range(epochs)]
        epoch_logs = {k: [float(np.mean(v[e * spe:(e + 1) * spe])) for e in range(epochs)]
                      for k, v in step_logs.items()}
        ev = model.evaluate(one_or_list(xs), one_or_list(ys), batch_size=BATCH, verbose=0,
                            return_dict=True)
        ev = {k: float(v) for k, v in ev.items()}

        with tempfile.TemporaryDirectory() as d:
            wpath = os.path.join(d, "final.weights.h5")
            model.save_weights(wpath)
            final = layer_weights(wpath)
        mixed = "float32_twin" in mm.MODELS[model_name]
        if mixed:
            f32_loss = float32_losses(model_name, keras_path, xs, ys, n, epochs, skipped)
        if "mixed_twin" in mm.MODELS[model_name]:  # a bfloat16 model: its mixed_bfloat16 twin
            mixed_loss = float32_losses(model_name, keras_path, xs, ys, n, epochs,
                                        twin_key="mixed_twin")
        # Frozen layers (trainable=False): the weights Keras left bit for bit
        # as they were, which kdcc must leave so too.
        frozen = []
        if any(not layer.trainable or isinstance(layer, keras.layers.Normalization)
               for layer in model.layers):  # issue 25: adapted statistics too
            initial = archive_weights(keras_path)
            frozen = [k for k in sorted(final) if np.array_equal(final[k], initial[k])]
    finally:
        keras.distribution.set_distribution(None)

    # Final weights: shared with an earlier case of the model when equal.
    # under a mixed policy both runs' key-bias updates are rounding noise (up
    # to the rate a step each, either sign): twice the bound
    atol = noise_atol(final, float(keras.ops.convert_to_numpy(
        model.optimizer.learning_rate)) * (2 if mixed else 1), len(step_loss))
    final_name, note = write_final(mdir, case, model_name, final, atol, spec)
    ref = {
        "case": case,
        "model": model_name,
        "distribution": dist_name + ".dist.json",
        "devices": int(np.prod(spec["device_mesh"]["shape"])),
        "versions": f"keras {keras.__version__}, jax {jax.__version__}",
        "samples": n,
        "batch_size": BATCH,
        "epochs": epochs,
        "shuffle": False,
        "dropout": "every Dropout rate set to 0",
        "metric": metric,
        "step_loss": step_loss,
        "step_metric": step_metric,
        "epoch_loss": epoch_loss,
        "evaluate": ev,
        "final_weights": final_name,
        "inputs": inputs,
        "outputs": outputs,
        "x_files": xf,
        "y_files": yf,
        "step_logs": step_logs,
        "epoch_logs": epoch_logs,
        "kdcc_args": ["model.keras", "--distribution", case + ".dist.json",
                      "--batch-size", str(BATCH)],
        "program_args": program_args(xf, yf, None, None, epochs),
        "program_args_named": program_args(xf, yf, [i["name"] for i in inputs],
                                           [o["name"] for o in outputs], epochs),
    }
    if note:
        ref["final_weights_note"] = note
    if mixed:
        initial = os.path.join(mdir, "initial.npz")
        if not os.path.exists(initial):
            np.savez_compressed(initial, **archive_weights(keras_path))
        ref.update(
            dtype_policy=model.dtype_policy.name, rtol=MIXED_RTOL,
            update_rtol=MIXED_UPDATE_RTOL, initial_weights="initial.npz",
            float32_step_loss=f32_loss, float32_min_distance=MIXED_FROM_F32,
            mixed_note=("mixed precision: losses and metrics within rtol, the training update "
                        "(final minus initial weights) within update_rtol in norm per "
                        "tensor, and the step losses at least float32_min_distance times "
                        "Keras's own distance from its float32 run (float32_step_loss, the "
                        "same model and weights under float32) away from that run"))
    if "mixed_twin" in mm.MODELS[model_name]:
        ref.update(mixed_step_loss=mixed_loss, mixed_min_distance=MIXED_FROM_F32,
                   update_rtol=PURE_UPDATE_RTOL)
    if scaled:  # issue 23: mixed_float16's LossScaleOptimizer
        lso = model.optimizer
        ref.update(
            loss_scale={"initial_scale": float(lso.initial_scale),
                        "dynamic_growth_steps": int(lso.dynamic_growth_steps),
                        "in_compile_config": model.get_compile_config()["optimizer"][
                            "class_name"] == "LossScaleOptimizer"},
            step_loss_scale=step_scale, skipped_steps=skipped,
            optimizer_iterations=int(lso.iterations.numpy()),
            loss_scale_note=("Keras's LossScaleOptimizer: step_loss_scale is its dynamic_scale "
                             "after each step, skipped_steps the steps whose gradients were not "
                             "finite (no update; the optimizer's iterations, "
                             "optimizer_iterations at the end, do not count them); "
                             "float32_step_loss is null there (the float32 run skips them too)"))
    if frozen:
        ref["frozen_weights"] = frozen
    return finish_ref(mdir, case, ref, atol)


# kdcc-only cases: another layout checked against a Keras case's numbers
# (which do not depend on the mesh), where Keras cannot run the layout
# itself. case -> (Keras's case, spec).
DERIVED_CASES = {
    # XLA aborts on a grouped convolution under a (2,4) mesh
    "grouped_mp": ("grouped_dp", mm.model_parallel({
        "conv2d/kernel": [None, None, None, "model"],
        "depthwise_conv2d/kernel": [None, None, "model", None],
        "depthwise_conv2d/bias": ["model"],
        "separable_conv2d/depthwise_kernel": [None, None, "model", None],
        "separable_conv2d/pointwise_kernel": [None, None, None, "model"],
    })),
    # the same; every channel dim split over 'model' (the depthwise
    # kernels' and the batch norms' too), the residual Add on shards
    "mobilenet_mp": ("mobilenet_dp", mm.model_parallel({
        "stem/kernel": [None, None, None, "model"],
        "dw1/kernel": [None, None, "model", None],
        "pw1/kernel": [None, None, None, "model"],
        "expand/kernel": [None, None, None, "model"],
        "dw2/kernel": [None, None, "model", None],
        "project/kernel": [None, None, None, "model"],
        ".*_bn/(gamma|beta|moving_mean|moving_variance)": ["model"],
        "out/kernel": ["model", None],
    })),
}


def write_derived(case, out):
    """DERIVED_CASES[case]: its Keras case's JSON under another spec."""
    src, spec = DERIVED_CASES[case]
    mdir = os.path.join(out, CASES[src][0])
    ref = json.load(open(os.path.join(mdir, src + ".json")))
    ref.update(case=case, distribution=case + ".dist.json",
               devices=int(np.prod(spec["device_mesh"]["shape"])),
               kdcc_args=["model.keras", "--distribution", case + ".dist.json",
                          "--batch-size", str(BATCH)],
               derived_from=f"{src}'s Keras run: Keras cannot run this layout")
    for path, obj in ((case + ".dist.json", spec), (case + ".json", ref)):
        with open(os.path.join(mdir, path), "w") as f:
            json.dump(obj, f, indent=2 if path.endswith("dist.json") else 1)
            f.write("\n")


def fit_spec(model_name, stem):
    return mm.DP_8 if stem == "dp8" else mm.MODELS[model_name]["dists"][stem]


def batches(n, bs):
    """Keras's batches of n samples: [start, end) each, the last partial."""
    return [(s, min(s + bs, n)) for s in range(0, n, bs)]


def fit_history(model, xs, ys, vx, vy, bs, epochs, val, cfg, csv=None, best=None):
    """(model.fit's History, the model) with the case's callbacks, then
    (as kdcc runs them) ModelCheckpoint(save_best_only) writing best, when
    the case has one, and CSVLogger writing csv."""
    kw = (dict(validation_data=(one_or_list(vx), one_or_list(vy))) if val == "data"
          else dict(validation_split=val))
    ck = cfg.get("callbacks", {}).get("checkpoint_best")
    cbs = make_callbacks(cfg)
    if ck and best:
        cbs.append(keras.callbacks.ModelCheckpoint(best, save_best_only=True,
                                                   save_weights_only=True, **ck))
    cbs += [keras.callbacks.CSVLogger(csv)] if csv else []
    h = model.fit(one_or_list(xs), one_or_list(ys), batch_size=bs, epochs=epochs,
                  shuffle=False, verbose=0, callbacks=cbs, **kw)
    return h.history, model


def run_fit_case(case, out):
    """One of FIT_CASES: train_on_batch for every step's own logs, model.fit
    for the History, evaluate on the validation data (see the docstring)."""
    model_name, kdcc_dist, keras_dist, cfg = FIT_CASES[case]
    bs, epochs, val = cfg["batch"], cfg["epochs"], cfg["val"]
    entry = mm.MODELS[model_name]
    mdir = os.path.join(out, model_name + "_fit")
    os.makedirs(mdir, exist_ok=True)
    ntrain, nval = FIT_DATA
    xs_all, ys_all, xf, yf = make_data(model_name, ntrain + nval)
    train = slice(0, ntrain)
    xs, ys = [a[train] for a in xs_all], [a[train] for a in ys_all]
    vx, vy = [a[ntrain:] for a in xs_all], [a[ntrain:] for a in ys_all]
    vxf, vyf = ["val_" + f for f in xf], ["val_" + f for f in yf]
    if val == "data":
        fit_x, fit_y, ev_x, ev_y = xs, ys, vx, vy
    else:  # Keras's validation_split: the last fraction, before any shuffling
        split_at = int(np.floor(ntrain * (1.0 - val)))
        fit_x, fit_y = [a[:split_at] for a in xs], [a[:split_at] for a in ys]
        ev_x, ev_y = [a[split_at:] for a in xs], [a[split_at:] for a in ys]

    def build():
        keras.backend.clear_session()
        keras.utils.set_random_seed(mm.SEED)
        keras.distribution.set_distribution(
            mm.make_distribution(fit_spec(model_name, keras_dist)))
        model = entry["build"]()
        zero_dropout(model)
        if "lr" in cfg:
            model.optimizer.learning_rate = cfg["lr"]
        return model

    try:
        # 1. every step's own logs: train_on_batch on fit's batches
        model = build()
        inputs, outputs = io_description(model, xs, ys, xf, yf)
        keras_path = os.path.join(mdir, "model.keras")
        if not os.path.exists(keras_path):
            mm.save_archive(model, keras_path, True)
            for a, f in zip(xs + ys, xf + yf):
                np.save(os.path.join(mdir, f), a)
            for a, f in zip(vx + vy, vxf + vyf):
                np.save(os.path.join(mdir, f), a)
        else:
            with tempfile.TemporaryDirectory() as d:
                mm.save_archive(model, os.path.join(d, "m.keras"), True)
                mine = archive_weights(os.path.join(d, "m.keras"))
            theirs = archive_weights(keras_path)
            for k in mine:
                assert np.array_equal(mine[k], theirs[k]), f"{case}: initial {k} differs"
        n_fit = len(fit_x[0])
        step_loss, step_logs = [], {}
        # With callbacks, fit's History (below, run first) drives the same
        # callbacks here at every epoch's end: they act on fit's logs.
        cbs = make_callbacks(cfg)
        if cbs:
            hist = fit_history(build(), xs, ys, vx, vy, bs, epochs, val, cfg)[0]
            model = build()
        for cb in cbs:
            cb.set_model(model)
            cb.on_train_begin()
        model.stop_training = False
        for e in range(epochs):
            for a, b in batches(n_fit, bs):
                logs = model.train_on_batch(one_or_list(fit_x, slice(a, b)),
                                            one_or_list(fit_y, slice(a, b)), return_dict=True)
                step_loss.append(float(logs["loss"]))
                for k, v in logs.items():
                    step_logs.setdefault(k, []).append(float(v))
            if cbs:
                logs = {k: v[e] for k, v in hist.items() if k != "learning_rate"}
                for cb in cbs:
                    cb.on_epoch_end(e, logs)
                if model.stop_training:
                    break
        for cb in cbs:
            cb.on_train_end()
        with tempfile.TemporaryDirectory() as d:
            model.save_weights(os.path.join(d, "a.weights.h5"))
            final_a = layer_weights(os.path.join(d, "a.weights.h5"))
        keras.distribution.set_distribution(None)

        # 2. the same training through fit: the History
        csv = os.path.join(mdir, case + ".csv") if cbs else None
        best_dir = tempfile.mkdtemp()
        best = os.path.join(best_dir, "best.weights.h5")
        hist, model = fit_history(build(), xs, ys, vx, vy, bs, epochs, val, cfg, csv, best)
        if os.path.exists(best):  # ModelCheckpoint's file, as the case's .best.npz
            np.savez_compressed(os.path.join(mdir, case + ".best.npz"), **layer_weights(best))
        shutil.rmtree(best_dir)
        ev = model.evaluate(one_or_list(ev_x), one_or_list(ev_y), batch_size=bs, verbose=0,
                            return_dict=True)
        ev = {k: float(v) for k, v in ev.items()}
        with tempfile.TemporaryDirectory() as d:
            model.save_weights(os.path.join(d, "b.weights.h5"))
            final = layer_weights(os.path.join(d, "b.weights.h5"))
        worst = max(max_rel(final_a[k], final[k]) for k in final)
        assert worst <= 1e-6, f"{case}: train_on_batch and fit end {worst:.1e} apart"
    finally:
        keras.distribution.set_distribution(None)

    final_name = case + ".final.npz"
    np.savez_compressed(os.path.join(mdir, final_name), **final)
    spec = fit_spec(model_name, kdcc_dist)
    with open(os.path.join(mdir, case + ".dist.json"), "w") as f:
        json.dump(spec, f, indent=2)
        f.write("\n")
    epoch_logs = {k: [float(v) for v in vs] for k, vs in hist.items()}
    data_args = []
    for flag, files in (("--x", xf), ("--y", yf)):
        for f in files:
            data_args += [flag, f]
    if val == "data":
        for flag, files in (("--val-x", vxf), ("--val-y", vyf)):
            for f in files:
                data_args += [flag, f]
    else:
        data_args += ["--validation-split", str(val)]
    compile_bs = cfg.get("compile_batch", bs)
    ref = {
        "case": case,
        "model": model_name,
        "distribution": case + ".dist.json",
        "devices": int(np.prod(spec["device_mesh"]["shape"])),
        "keras_distribution": keras_dist,
        "versions": f"keras {keras.__version__}, jax {jax.__version__}",
        "samples": ntrain,
        "validation": {"data": nval} if val == "data" else {"split": val},
        "batch_size": bs,
        "compile_batch_size": compile_bs,
        "epochs": epochs,
        "shuffle": False,
        "dropout": "every Dropout rate set to 0",
        "step_loss": step_loss,
        "epoch_loss": epoch_logs["loss"],
        "evaluate": ev,
        "final_weights": final_name,
        "inputs": inputs,
        "outputs": outputs,
        "x_files": xf,
        "y_files": yf,
        "step_logs": step_logs,
        "epoch_logs": epoch_logs,
        "kdcc_args": ["model.keras", "--distribution", case + ".dist.json",
                      "--batch-size", str(compile_bs)],
        "program_args": data_args + ["--epochs", str(epochs), "--batch-size", str(bs),
                                     "--no-shuffle", "--weights", "model.keras"]
                        + callback_args(cfg),
    }
    if cfg.get("callbacks"):
        ref["callbacks"] = cfg["callbacks"]
        ref["epochs_run"] = len(epoch_logs["loss"])
        ref["csv_log"] = case + ".csv"  # Keras's CSVLogger file
        if "checkpoint_best" in cfg["callbacks"]:  # ModelCheckpoint's weights
            ref["checkpoint_best"] = case + ".best.npz"
    with open(os.path.join(mdir, case + ".json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(f"{case}: {len(step_loss)} steps, loss {step_loss[0]:.6f} -> {step_loss[-1]:.6f}, "
          f"History {({k: [round(x, 4) for x in v] for k, v in epoch_logs.items()})}, "
          f"evaluate {ev}")
    return ref


def check(out, ref_dir, rtol, cases):
    """Compare a fresh run (out) with the committed fixtures (ref_dir)."""
    bad = 0
    for case in cases:
        model_name = model_dir(case)
        a_dir, b_dir = os.path.join(out, model_name), os.path.join(ref_dir, model_name)
        a = json.load(open(os.path.join(a_dir, case + ".json")))
        b = json.load(open(os.path.join(b_dir, case + ".json")))
        worst = 0.0
        for k, vb in b.get("epoch_logs", {}).items():  # fit's History (val_ logs too)
            va = a.get("epoch_logs", {}).get(k)
            if va is None or len(va) != len(vb):
                print(f"{case}: epoch_logs[{k!r}] missing or of another length")
                bad = 1
                continue
            for u, v in zip(va, vb):
                worst = max(worst, abs(u - v) / max(abs(v), 1e-12))
        for key in ("step_loss", "epoch_loss"):
            if len(a[key]) != len(b[key]):
                print(f"{case}: {key} has {len(a[key])} entries, committed {len(b[key])}")
                bad = 1
                continue
            for u, v in zip(a[key], b[key]):
                worst = max(worst, abs(u - v) / max(abs(v), 1e-12))
        for k, v in b["evaluate"].items():
            worst = max(worst, abs(a["evaluate"][k] - v) / max(abs(v), 1e-12))
        for k, vb in b.get("step_logs", {}).items():  # every log of every step
            va = a.get("step_logs", {}).get(k)
            if va is None or len(va) != len(vb):
                print(f"{case}: step_logs[{k!r}] missing or of another length")
                bad = 1
                continue
            for u, v in zip(va, vb):
                worst = max(worst, abs(u - v) / max(abs(v), 1e-12))
        fa = dict(np.load(os.path.join(a_dir, a["final_weights"])))
        fb = dict(np.load(os.path.join(b_dir, b["final_weights"])))
        if fa.keys() != fb.keys():
            print(f"{case}: final weights have other paths: {sorted(fa)} vs {sorted(fb)}")
            bad = 1
        else:
            w, noise_ok = weights_diff(fa, fb, b.get("final_weights_atol", {}))
            worst = max(worst, w)
            if not noise_ok:
                print(f"{case}: {sorted(b['final_weights_atol'])} over their absolute tolerance")
                bad = 1
        ia = archive_weights(os.path.join(a_dir, "model.keras"))
        ib = archive_weights(os.path.join(b_dir, "model.keras"))
        same_init = ia.keys() == ib.keys() and all(np.array_equal(ia[k], ib[k]) for k in ib)
        same_data = all(np.array_equal(np.load(os.path.join(a_dir, f)),
                                       np.load(os.path.join(b_dir, f)))
                        for f in b.get("x_files", ["x.npy"]) + b.get("y_files", ["y.npy"]) +
                        (["val_" + f for f in b["x_files"] + b["y_files"]]
                         if "data" in b.get("validation", {}) else []))
        ok = worst <= rtol and same_init and same_data
        print(f"{case}: worst relative difference {worst:.2e}, initial weights "
              f"{'equal' if same_init else 'DIFFER'}, data {'equal' if same_data else 'DIFFERS'}"
              f" ({'ok' if ok else 'DIFFERS'})")
        bad |= not ok
    return bad


def model_dir(case):
    """The folder (under OUT) a case writes."""
    if case in hub.CASES:
        return hub.CASES[case][0]
    return CASES[case][0] if case in CASES else FIT_CASES[case][0] + "_fit"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", help="output folder (default: the fixtures: "
                    "tests/fixtures/keras_ref/, tests/fixtures/keras_hub/ for the hub_ cases)")
    ap.add_argument("--cases", nargs="*", default=list(CASES) + list(FIT_CASES),
                    choices=list(CASES) + list(FIT_CASES) + list(hub.CASES))
    ap.add_argument("--hlo", action="store_true",
                    help="also write OUT/<case>.hlo.txt, the compiled train step")
    ap.add_argument("--check", metavar="DIR",
                    help="then compare OUT with the fixtures in DIR")
    ap.add_argument("--rtol", type=float, default=1e-5)
    args = ap.parse_args()
    print(f"keras {keras.__version__}, jax {jax.__version__}, devices: {len(jax.devices())}")
    if len(jax.devices()) < 8:
        sys.exit("run_ref.py needs 8 devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)")
    # Start from a clean slate for every model written (model.keras decides
    # whether a case is the first of its model).
    def out(case):
        return args.out or (hub.FIXTURES if case in hub.CASES else FIXTURES)

    for m in {(out(c), model_dir(c)) for c in args.cases}:
        shutil.rmtree(os.path.join(*m), ignore_errors=True)
    for case in args.cases:
        if case in hub.CASES:
            hub.run_case(case, out(case), sys.modules[__name__])
        elif case in FIT_CASES:
            run_fit_case(case, out(case))
        else:
            run_case(case, out(case), args.hlo)
    for case, (src, _spec) in DERIVED_CASES.items():
        if src in args.cases:
            write_derived(case, out(src))
    if args.check:
        return max([check(out(c), args.check, args.rtol, [c]) for c in args.cases], default=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
