"""keras-hub CausalLM reference cases (issue 24), for run_ref.py.

Tiny random GPT2CausalLM, LlamaCausalLM, Llama3CausalLM, GemmaCausalLM,
Gemma3CausalLM (text only), MistralCausalLM, QwenCausalLM, Qwen3CausalLM
and a Gemma 2 (GemmaCausalLM with Gemma 2's settings) built from their
hyper-parameters (no downloads, preprocessor=None), trained in real Keras
on JAX with 8 virtual CPU devices under DataParallel and under a layout
map on a (2,4) mesh: GPT-2 under a Megatron map written here (keras-hub
has none for it), Llama, Llama 3, Gemma and Qwen under the backbone's own
get_layout_map(mesh), whose mesh axes are keras-hub's defaults ('batch',
'model'), Mistral and Qwen 3 under Llama's (MistralBackbone and
Qwen3Backbone have none), Gemma 2 and Gemma 3 (Gemma3Backbone has none)
under Gemma's with the key/value kernels' head axis not split (their 2
key/value heads do not divide over 'model'). hub_mistral_sw and hub_gemma2_sw are
hub_mistral and hub_gemma2 with a sliding window of 4 (Gemma 2's on blocks 0
and 2 of 3), short enough that some padded queries have no key left (see
window_masked). Run by name only:

    python3 tests/keras_ref/run_ref.py --cases hub_gpt2 hub_gpt2_dp hub_llama \\
        hub_llama_dp hub_gemma hub_gemma_dp hub_mistral hub_mistral_dp hub_qwen \\
        hub_qwen_dp hub_gemma2 hub_gemma2_dp hub_mistral_sw hub_mistral_sw_dp \\
        hub_gemma2_sw hub_gemma2_sw_dp          # rewrites tests/fixtures/keras_hub/
    python3 tests/keras_ref/run_ref.py --cases hub_llama3 hub_llama3_dp hub_qwen3 \
        hub_qwen3_dp
    python3 tests/keras_ref/hub_models.py --generate --models hub_llama3 hub_qwen3
    python3 tests/keras_ref/run_ref.py --cases hub_gemma3 hub_gemma3_dp
    python3 tests/keras_ref/hub_models.py --generate --models hub_gemma3

(hub_llama3 and hub_qwen3 have one block each and 16-wide hidden states:
each folder about 215 KB.)

(--out DIR writes DIR/hub_gpt2/ ... instead; --check tests/fixtures/keras_hub
compares.) They are not in run_ref.py's default case list and live apart from
tests/fixtures/keras_ref/ until kdcc compiles keras-hub models; then
KERAS_REF_DIR=tests/fixtures/keras_hub tests/sh/keras_ref.sh checks them.

Per model (OUT/hub_<model>/), in the format keras_ref.sh reads:

    model.keras          the task (GPT2CausalLM, ...) with its initial weights
                         and its compile config: Adam(1e-3) (keras-hub's
                         default rate is 2e-5), keras-hub's default loss
                         SparseCategoricalCrossentropy(from_logits=True) and
                         weighted_metrics [SparseCategoricalAccuracy]
    preset/              task.save_to_preset(): config.json (the backbone),
                         task.json, metadata.json (date fixed), and
                         model.weights.h5 (the backbone's INITIAL weights); no
                         compile settings
    padding_mask.npy, token_ids.npy
                         the inputs (int32, N x 16), in task.inputs order:
                         Keras flattens the inputs dict by sorted key, so
                         padding_mask comes first (x_files says so). Half the
                         rows are padded: ones then trailing zeros, the pad
                         positions' token id 0
    y.npy                the labels (int32, N x 16): the next token (token_ids
                         shifted left one, a fresh id last). No sample weights
                         (kdcc has none): padded positions count in the loss
                         as they do in Keras's fit(x, y) without
                         sample_weight; the padding mask masks attention only
    final.npz, <case>.json, <case>.dist.json
                         as run_ref.py's other cases, plus "hub" in the JSON:
                         the task and backbone classes, sequence_length, the
                         preset folder and what compiling it means

LoRA cases (OUT/hub_llama_lora/: hub_llama_lora under Llama's layout map,
hub_llama_lora_dp; OUT/hub_gpt2_lora/: hub_gpt2_lora_dp; OUT/hub_qwen3_lora/:
hub_qwen3_lora under Llama's map, hub_qwen3_lora_dp; OUT/hub_gemma3_lora/:
hub_gemma3_lora under hub_gemma3's map, hub_gemma3_lora_dp), written apart so
keras_hub.sh's folders stay LoRA-free:

    python3 tests/keras_ref/run_ref.py --cases hub_llama_lora hub_llama_lora_dp \
        hub_gpt2_lora_dp hub_qwen3_lora hub_qwen3_lora_dp hub_gemma3_lora hub_gemma3_lora_dp

The same model, seed and data as hub_llama / hub_gpt2 (model.keras is the
task saved BEFORE backbone.enable_lora(4): LoRA is not in a config, so kdcc
is told --lora-rank 4; no preset/), then enable_lora(4), compiled again with
Adam(1e-3), and:

    initial.lora.h5      backbone.save_lora_weights() before training: the
                         starting A (he_uniform) and B (zeros), for the
                         program's --lora-weights
    final.npz            the trained task's save_weights: merged kernels
                         W + A.B, no LoRA variables (as any case's)
    final.lora.h5        save_lora_weights() after training
    "lora" in the JSON   rank, alpha, scale, the target layers by
                         save_lora_weights index (their kernel, A and B shapes
                         and the weights file's kernel dataset), the trainable
                         variables (GPT-2's query/value biases too), and the
                         checks made: every frozen variable bit for bit
                         unchanged, every A and B changed, the saved kernels
                         merged

Mixed precision (issue 23): hub_gpt2_mixed, hub_llama_mixed,
hub_gemma_mixed, hub_gemma2_mixed, hub_mistral_mixed and hub_qwen_mixed
(each with _dp) are hub_gpt2, hub_llama, hub_gemma, hub_gemma2 (its soft caps
and extra norms), hub_mistral and hub_qwen (its biases) with the
backbone built with dtype="mixed_bfloat16" (the same seed: the same initial
weights, which the JSON's hub.same_initial_weights_as says when the float32
folder is there), compiled without metrics; hub_gemma_lora_mixed (and _dp)
fine-tunes hub_gemma_mixed with LoRA as the LoRA cases do. hub_qwen3_mixed
and hub_gemma3_mixed (each with _dp) are hub_qwen3 and hub_gemma3 so (their
query/key norms: the scale read in bfloat16, the norm in float32, its output
cast back), hub_gemma3_mixed trained with SGD16's SGD (see SGD16: under
Adam(1e-3), measured, its query norm's scale ended 0.196 from keras-hub's
update under the (2,4) map, where keras-hub's own two meshes are 0.193
apart and kdcc 0.012 from its DataParallel one); its JSON's hub.variants
has the global block's losses under the policy (and float32_batch_losses:
the same without it), which keras_hub.sh checks as hub_gemma3's.
hub_gemma2_mixed and hub_llama3_mixed (each with _dp) are not among
keras_hub.sh's cases (nor their fixtures). hub_llama3_mixed, measured once
(--out elsewhere, hub_llama3 copied there first): kdcc's step losses within
2.5e-5 of keras-hub's (from float32 1.2e-4, keras-hub's own 1.5e-4), every
update within 0.034; Llama 3.1's rope scaling changes only the float32
inverse frequencies (LlamaRotaryEmbedding._get_inverse_freq), before the
cos/sin are cast to the compute dtype as Llama's: no rounding point of its
own. hub_gemma2_mixed, measured once: kdcc's
step losses were within 2.2e-4 of keras-hub's (from float32 8.0e-4, keras-hub's
own 7.0e-4) and every update within 0.1 but one, block 1's pre_ffw_norm scale
under the (2,4) map at 0.12 (two of its 32 values, where Adam's steps follow
gradients near zero; 0.09 under DataParallel). Measured again: the same
(0.119, 0.091), and keras-hub's own first step, a forward pass from the same
weights, differs between its two meshes by 5.0e-5 relative (4.557163 under
the map, 4.556936 under DataParallel: XLA rounds Gemma 2's forward
differently per sharding), where kdcc's (the same on both) is within 3.1e-6
of the map's; keeping the attention's soft cap in float32 (6.0e-6), or the
whole score chain (3.4e-5), moves kdcc's first step away from it and only
trades which mesh's pre_ffw_norm is over 0.1 (0.090 and 0.105; 0.084 and
0.099): noise, not a rounding point kdcc misses. Each model's cases are run
together (run_ref.py clears a model's folder first):

    python3 tests/keras_ref/run_ref.py --cases hub_gpt2_mixed hub_gpt2_mixed_dp \
        hub_llama_mixed hub_llama_mixed_dp hub_gemma_mixed hub_gemma_mixed_dp \
        hub_gemma2_mixed hub_gemma2_mixed_dp hub_gemma_lora_mixed hub_gemma_lora_mixed_dp \
        hub_mistral_mixed hub_mistral_mixed_dp hub_qwen_mixed hub_qwen_mixed_dp
    python3 tests/keras_ref/run_ref.py --cases hub_qwen3_mixed hub_qwen3_mixed_dp \
        hub_gemma3_mixed hub_gemma3_mixed_dp

Their JSON has run_ref.py's mixed fields: dtype_policy, rtol, update_rtol,
initial_weights (initial.npz), float32_step_loss (the same task without the
policy, trained from the same weights and LoRA A and B on the same mesh) and
float32_min_distance. Under the policy keras-hub saves a LoRA layer's merged
kernel cast to bfloat16; final.npz holds the float32 merge of its final
variables instead (lora.final_merged_note).

bfloat16 (issue 23): hub_gemma_bf16, hub_gemma2_bf16, hub_llama_bf16 and
hub_gpt2_bf16 (each with _dp) are hub_gemma, hub_gemma2 (its soft caps and
extra norms), hub_llama and hub_gpt2 with the backbone built with
dtype="bfloat16" (every variable bfloat16), starting from the float32
model's initial weights rounded to bfloat16 (as from_preset(...,
dtype="bfloat16") loads a float32 preset: hub.same_initial_weights_as says
so), trained with AdamW(1e-2, beta_2=0.99) (Gemma, Gemma 2) or SGD(0.1,
momentum=0.9) (Llama, GPT-2, Gemma 3: see SGD16); hub_gemma_lora_bf16 (and _dp)
fine-tunes hub_gemma_bf16 with LoRA (the frozen kernels bfloat16, A and B
float32 as Keras's enable_lora makes them). hub_qwen3_bf16 and hub_gemma3_bf16 (AdamW and
SGD, each with _dp) are hub_qwen3 and hub_gemma3 so, hub_gemma3_lora_bf16 (and
_dp) fine-tunes hub_gemma3_bf16 with LoRA. hub_gpt2_lora_bf16_dp (GPT-2's
LoRA, its query and value biases bfloat16 and trained, A and B float32) is
not among keras_hub.sh's cases: measured once, kdcc's step losses within
8e-6 of keras-hub's and every update within 0.043, but SGD barely moves it
(keras-hub's own distance from its float32 run 3.3e-5). Their JSON has
run_ref.py's bfloat16
fields (update_rtol 0.2, float32_step_loss and mixed_step_loss: the
float32 and mixed_bfloat16 twins from the same weights, with the same
optimizer) and hub.learning_rate (the program's --lr for the preset):

    python3 tests/keras_ref/run_ref.py --cases hub_gemma_bf16 hub_gemma_bf16_dp \
        hub_gemma2_bf16 hub_gemma2_bf16_dp hub_llama_bf16 hub_llama_bf16_dp \
        hub_gpt2_bf16 hub_gpt2_bf16_dp hub_gemma_lora_bf16 hub_gemma_lora_bf16_dp
    python3 tests/keras_ref/run_ref.py --cases hub_qwen3_bf16 hub_qwen3_bf16_dp \
        hub_gemma3_bf16 hub_gemma3_bf16_dp hub_gemma3_lora_bf16 hub_gemma3_lora_bf16_dp

Greedy generation (python3 tests/keras_ref/hub_models.py --generate [--out
DIR]): each model's task from its model.keras (initial weights),
compile(sampler="greedy"), generate() on 4 right-padded prompts (lengths 3,
8, 5, 6) in a 16-token window, no stop token; OUT/hub_<model>/generate/:
token_ids.npy, padding_mask.npy (int32 inputs), out_token_ids.npy (int32),
out_padding_mask.npy (bool, as generate returns it) and generate.json (the
semantics, the smallest logit gap between a chosen id and the runner-up).
"""

import json
import os
import re
import tempfile

import make_models as mm  # first: sets KERAS_BACKEND, XLA_FLAGS (8 devices)

import h5py  # noqa: E402
import jax  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402
import numpy as np  # noqa: E402

FIXTURES = os.path.join(mm.ROOT, "tests", "fixtures", "keras_hub")
SEQ = 16
VOCAB = 96
SAMPLES = 64  # 4 steps of 16 per epoch
EPOCHS = 2
LR = 1e-3

M = keras_hub.models

# model -> (task class, backbone class, backbone hyper-parameters)
MODELS = {
    "hub_gpt2": (M.GPT2CausalLM, M.GPT2Backbone, dict(
        vocabulary_size=VOCAB, num_layers=2, num_heads=4, hidden_dim=32,
        intermediate_dim=64, dropout=0.0, max_sequence_length=SEQ)),
    # head_dim 32 / 8 = 4; rope defaults (max wavelength 10000, scaling 1)
    "hub_llama": (M.LlamaCausalLM, M.LlamaBackbone, dict(
        vocabulary_size=VOCAB, num_layers=2, num_query_heads=8, num_key_value_heads=4,
        hidden_dim=32, intermediate_dim=64, dropout=0)),
    # 4 key/value heads: get_layout_map splits the key and value kernels'
    # heads over 'model' (4) too, so 1 (MQA) would not divide
    "hub_gemma": (M.GemmaCausalLM, M.GemmaBackbone, dict(
        vocabulary_size=VOCAB, num_layers=2, num_query_heads=4, num_key_value_heads=4,
        head_dim=8, hidden_dim=32, intermediate_dim=64, dropout=0)),
    # Llama's sizes but Mistral's head_dim 6 (not 32 / 8 = 4: query kernel
    # [32, 8, 6]; 6, not 8, keeps the folder under 600 KB) and keras-hub's
    # RotaryEmbedding with rope_scaling_factor 2 (with head_dim None and the
    # rope defaults it is hub_llama to the bit: same seed, same draws); a
    # sliding window of 32 covers the 16 steps (hub_mistral_sw's does not)
    "hub_mistral": (M.MistralCausalLM, M.MistralBackbone, dict(
        vocabulary_size=VOCAB, num_layers=2, num_query_heads=8, num_key_value_heads=4,
        hidden_dim=32, intermediate_dim=64, head_dim=6, rope_scaling_factor=2.0,
        sliding_window=32, dropout=0)),
    # hub_mistral with a sliding window of 4: a query sees itself and the 3
    # steps before it (keras-hub's banded mask i < j + 4, with the causal and
    # padding masks)
    "hub_mistral_sw": (M.MistralCausalLM, M.MistralBackbone, dict(
        vocabulary_size=VOCAB, num_layers=2, num_query_heads=8, num_key_value_heads=4,
        hidden_dim=32, intermediate_dim=64, head_dim=6, rope_scaling_factor=2.0,
        sliding_window=4, dropout=0)),
    # query/key/value biases (random at the start: QWEN_BIAS_STD), the head
    # tied (tie_word_embeddings's default)
    "hub_qwen": (M.QwenCausalLM, M.QwenBackbone, dict(
        vocabulary_size=VOCAB, num_layers=2, num_query_heads=8, num_key_value_heads=4,
        hidden_dim=32, intermediate_dim=64, dropout=0)),
    # Llama 3 (Llama3Backbone: LlamaBackbone's layers, its own class and
    # weights-file group) with Llama 3.1's rope scaling on, smaller than
    # hub_llama (one block: the folder under 250 KB): head_dim 16 / 4 = 4, whose two
    # inverse frequencies 1 and 1e-2 (wavelengths 6.3 and 628 steps) are
    # both adjusted for a pretraining length of 8 (low/high frequency
    # factors 1 and 4: wavelengths past 8 divided by 8, those between 2 and
    # 8 smoothed: 1 becomes 0.205). 4 key/value heads, not 2: under Llama's
    # map on (2,4) kdcc has no decode step for 2 (its cache's rows are not
    # dim 0 alone: generate falls back to the whole window; noted, not fixed)
    "hub_llama3": (M.Llama3CausalLM, M.Llama3Backbone, dict(
        vocabulary_size=VOCAB, num_layers=1, num_query_heads=4, num_key_value_heads=4,
        hidden_dim=16, intermediate_dim=32, rope_frequency_adjustment_factor=8.0,
        rope_low_freq_factor=1.0, rope_high_freq_factor=4.0,
        rope_pretraining_sequence_length=8, dropout=0)),
    # Qwen 3: no biases, each query and key head RMS-normalized before the
    # rotary embedding (their scales random at the start: QWEN3_NORM_RANGE),
    # head_dim 8 apart from 16 / 4, the head tied (the default), Qwen 3's
    # rope_max_wavelength 1e6; one block, as hub_llama3 (keras_hub.sh
    # compiles its preset with 3 blocks too: kdcc's repeated-block function)
    "hub_qwen3": (M.Qwen3CausalLM, M.Qwen3Backbone, dict(
        vocabulary_size=VOCAB, num_layers=1, num_query_heads=4, num_key_value_heads=2,
        head_dim=8, hidden_dim=16, intermediate_dim=32, rope_max_wavelength=1000000,
        dropout=0)),
    # Gemma 2's settings on GemmaBackbone: grouped query (2 key/value heads for
    # 4 query heads), post-attention and post-ffw norms, both soft caps small
    # enough to bite on a tiny random model (at the start 11-13% of the
    # attention scores and 9% of the final logits are beyond their cap; the
    # logits' largest value 2.5 becomes 0.99), no sliding window
    "hub_gemma2": (M.GemmaCausalLM, M.GemmaBackbone, dict(
        vocabulary_size=VOCAB, num_layers=2, num_query_heads=4, num_key_value_heads=2,
        head_dim=8, hidden_dim=32, intermediate_dim=64, attention_logit_soft_cap=2.0,
        final_logit_soft_cap=1.0, use_post_attention_norm=True, use_post_ffw_norm=True,
        use_sliding_window_attention=False, dropout=0)),
    # Gemma 3's text model (Gemma3Backbone, vision_encoder None): one block,
    # local (use_sliding_window_attention: blocks i % 6 < 5 are; a global one
    # needs six blocks, over the size a fixture may take): a sliding window of
    # 4, the local rotary embedding (wavelength 1e4, local_rope_scaling_factor
    # 2; the global 1e6 and 8 unused), query/key RMS norms, post norms, the
    # MLP intermediate_dim wide (gate_dim_reduction 1: 16, the folder under
    # 220 KB); every norm's scale
    # random (GEMMA3_NORM_RANGE) so that the norms matter
    "hub_gemma3": (M.Gemma3CausalLM, M.Gemma3Backbone, dict(
        vocabulary_size=VOCAB, image_size=16, num_layers=1, num_query_heads=4,
        num_key_value_heads=2, head_dim=8, hidden_dim=16, intermediate_dim=16,
        use_post_attention_norm=True, use_post_ffw_norm=True,
        use_sliding_window_attention=True, sliding_window_size=4,
        local_rope_scaling_factor=2.0, global_rope_scaling_factor=8.0, dropout=0)),
    # hub_gemma2 with 3 blocks and Gemma 2's sliding window: the even blocks
    # (0 and 2) attend within 4 steps (a query and the 3 before it), block 1
    # to the whole causal prefix
    "hub_gemma2_sw": (M.GemmaCausalLM, M.GemmaBackbone, dict(
        vocabulary_size=VOCAB, num_layers=3, num_query_heads=4, num_key_value_heads=2,
        head_dim=8, hidden_dim=32, intermediate_dim=64, attention_logit_soft_cap=2.0,
        final_logit_soft_cap=1.0, use_post_attention_norm=True, use_post_ffw_norm=True,
        use_sliding_window_attention=True, sliding_window_size=4, dropout=0)),
}

# issue 23: keras-hub under Keras's mixed_bfloat16 (the backbone built with
# dtype="mixed_bfloat16", as a user passes it or from_preset(..., dtype=)):
# hub_gpt2_mixed, hub_llama_mixed and hub_gemma_mixed are hub_gpt2, hub_llama
# and hub_gemma with that policy (the same seed: the same initial weights,
# checked when the float32 folder is there), compiled without metrics (a
# 16-bit rounding may flip an argmax); MIXED names the float32 model each
# mixed one's float32 twin is (trained from the mixed model's initial
# weights, as run_ref.py's mixed cases, to show how far bf16 moves the losses).
MIXED_POLICY = "mixed_bfloat16"
MIXED = {"hub_gpt2_mixed": "hub_gpt2", "hub_llama_mixed": "hub_llama",
         "hub_gemma_mixed": "hub_gemma", "hub_gemma2_mixed": "hub_gemma2",
         "hub_mistral_mixed": "hub_mistral", "hub_qwen_mixed": "hub_qwen",
         "hub_llama3_mixed": "hub_llama3", "hub_qwen3_mixed": "hub_qwen3",
         "hub_gemma3_mixed": "hub_gemma3"}
for _m, _f in MIXED.items():
    MODELS[_m] = MODELS[_f][:2] + (dict(MODELS[_f][2], dtype=MIXED_POLICY),)

# issue 23: keras-hub with the model in bfloat16 (backbone built with
# dtype="bfloat16", or from_preset(..., dtype="bfloat16")): every variable
# bfloat16 (LoRA's A and B float32: Keras's enable_lora makes them so), each
# optimizer step in bfloat16. The model starts from its float32 model's
# initial weights rounded to bfloat16 (as from_preset(..., dtype=) loads a
# float32 preset: assign casts), so the float32 preset compiled with
# --dtype-policy bfloat16 is the same model. Keras's default Adam does not
# move a bfloat16 variable (beta_2 0.999 is 1 in bfloat16: its steps are 0),
# so Gemma (Gemma 2, and Gemma's LoRA) trains with AdamW (keras-hub's fine-tuning
# guides') with beta_2 0.99 and a rate large enough to move bfloat16 weights
# (BF16_LR), Llama and GPT-2 with SGD and momentum (SGD16): under AdamW
# their attention's query and key kernels, whose gradients start near zero,
# take steps of the rate whatever the gradient's size, and keras-hub's own
# runs on the two meshes end 0.47 (Llama) and 0.17 (GPT-2) apart in those
# tensors' updates, rounding noise no other implementation can follow;
# under SGD they end within 0.09 and 0.10 (kdcc within 0.083 and 0.103 of
# them). Gemma 3's too (and hub_gemma3_mixed's): under AdamW (Adam) its
# query norm's scale, the gradient of its 8 values a sum that nearly
# cancels, takes steps of the rate, and keras-hub's own runs on the two
# meshes ended 0.25 (bfloat16) and 0.19 (mixed_bfloat16, Adam(1e-3)) apart
# in its update (kdcc 0.24 and 0.20 from the (2,4) map's, 0.07 and 0.01
# from DataParallel's; its first step's loss differs between keras-hub's
# meshes by 9e-5 relative: XLA rounds per sharding, kdcc on no mesh).
# No metrics. Their twins, from the same weights: the float32 model
# and its mixed_bfloat16 one (float32 variables), with the same optimizer.
BF16_POLICY = "bfloat16"
BF16_LR = 1e-2
BF16 = {"hub_gemma_bf16": "hub_gemma", "hub_llama_bf16": "hub_llama",
        "hub_gpt2_bf16": "hub_gpt2", "hub_gemma2_bf16": "hub_gemma2",
        "hub_qwen3_bf16": "hub_qwen3", "hub_gemma3_bf16": "hub_gemma3"}
for _m, _f in BF16.items():
    MODELS[_m] = MODELS[_f][:2] + (dict(MODELS[_f][2], dtype=BF16_POLICY),)


# the 16-bit models trained with SGD and momentum (above)
SGD16, SGD16_LR = ("hub_llama_bf16", "hub_gpt2_bf16", "hub_gemma3_bf16", "hub_gemma3_mixed"), 0.1


def half_optimizer(model):
    if model in SGD16:
        return keras.optimizers.SGD(SGD16_LR, momentum=0.9)
    return keras.optimizers.AdamW(BF16_LR, beta_2=0.99)


HALF = {**MIXED, **BF16}  # every 16-bit model -> its float32 model
MIXED_OF = {f: m for m, f in MIXED.items()}  # float32 model -> its mixed_bfloat16 one

# Qwen's query/key/value biases start at zero (bias_initializer "zeros");
# build() sets them to normal(0, QWEN_BIAS_STD) draws (rng seed 2, the
# variables in task.weights order) so they matter from the first step.
QWEN_BIAS_STD = 0.1

# Llama 3's query and key kernels: normal(0, 0.02) draws leave a tiny
# model's attention scores near zero, where the rotary embedding (and so
# Llama 3.1's frequency adjustment) barely shows (the step losses without
# the adjustment within 4e-6 of with it); build() draws them again from
# normal(0, LLAMA3_QK_STD) (rng seed 4, in task.weights order): scores of
# order 1.
LLAMA3_QK_STD = 0.5

# Qwen 3's query and key norms' scales start at ones; build() sets them to
# uniform(QWEN3_NORM_RANGE) draws (rng seed 3, in task.weights order), so
# that a query's scale used for a key (or not at all) shows from the first
# step.
QWEN3_NORM_RANGE = (0.5, 1.5)
# hub_gemma3's norm scales (zeros by keras-hub's initializer; the norms
# multiply by 1 + scale)
GEMMA3_NORM_RANGE = (-0.5, 0.5)

# GPT-2: Megatron over 'model' (keras-hub writes no layout map for it): q/k/v
# split on their heads, attention_output and feedforward_output on their
# input, feedforward_intermediate on its output, the (tied) token embedding on
# the vocabulary; norms and the position table replicated.
GPT2_MEGATRON = {
    r"transformer_layer_\d+/self_attention/(query|key|value)/kernel": [None, "model", None],
    r"transformer_layer_\d+/self_attention/(query|key|value)/bias": ["model", None],
    r"transformer_layer_\d+/self_attention/attention_output/kernel": ["model", None, None],
    r"transformer_layer_\d+/feedforward_intermediate_dense/kernel": [None, "model"],
    r"transformer_layer_\d+/feedforward_intermediate_dense/bias": ["model"],
    r"transformer_layer_\d+/feedforward_output_dense/kernel": ["model", None],
    "token_embedding/embeddings": ["model", None],
}

# case -> (model, distribution: "dp8", "megatron" or "layout_map", the
# backbone's get_layout_map on a (2,4) ('batch', 'model') mesh)
CASES = {
    "hub_gpt2": ("hub_gpt2", "megatron"),
    "hub_gpt2_dp": ("hub_gpt2", "dp8"),
    "hub_llama": ("hub_llama", "layout_map"),
    "hub_llama_dp": ("hub_llama", "dp8"),
    "hub_gemma": ("hub_gemma", "layout_map"),
    "hub_gemma_dp": ("hub_gemma", "dp8"),
    "hub_mistral": ("hub_mistral", "layout_map"),  # Llama's (Mistral has none)
    "hub_mistral_dp": ("hub_mistral", "dp8"),
    "hub_qwen": ("hub_qwen", "layout_map"),
    "hub_qwen_dp": ("hub_qwen", "dp8"),
    "hub_llama3": ("hub_llama3", "layout_map"),  # Llama3Backbone's (Llama's)
    "hub_llama3_dp": ("hub_llama3", "dp8"),
    "hub_qwen3": ("hub_qwen3", "layout_map"),  # Llama's (Qwen3Backbone has none)
    "hub_qwen3_dp": ("hub_qwen3", "dp8"),
    "hub_gemma2": ("hub_gemma2", "layout_map"),  # Gemma's, key/value heads whole
    "hub_gemma2_dp": ("hub_gemma2", "dp8"),
    # sliding windows of 4 (hub_mistral's and hub_gemma2's layout maps)
    "hub_mistral_sw": ("hub_mistral_sw", "layout_map"),
    "hub_mistral_sw_dp": ("hub_mistral_sw", "dp8"),
    "hub_gemma2_sw": ("hub_gemma2_sw", "layout_map"),
    "hub_gemma2_sw_dp": ("hub_gemma2_sw", "dp8"),
    # Gemma 3: Gemma's map, key/value heads whole, as hub_gemma2 (Gemma3Backbone
    # has none)
    "hub_gemma3": ("hub_gemma3", "layout_map"),
    "hub_gemma3_dp": ("hub_gemma3", "dp8"),
    # LoRA (issue 24): backbone.enable_lora(LORA_RANK) after model.keras is
    # saved; folders of their own (keras_hub.sh's cases stay LoRA-free)
    "hub_llama_lora": ("hub_llama_lora", "layout_map"),
    "hub_llama_lora_dp": ("hub_llama_lora", "dp8"),
    "hub_gpt2_lora_dp": ("hub_gpt2_lora", "dp8"),
    # Qwen 3's (save_lora_weights numbers its query and key norms too)
    "hub_qwen3_lora": ("hub_qwen3_lora", "layout_map"),
    "hub_qwen3_lora_dp": ("hub_qwen3_lora", "dp8"),
    # Gemma 3's (its attention numbers the key and query norms together,
    # after attention_output, before value)
    "hub_gemma3_lora": ("hub_gemma3_lora", "layout_map"),
    "hub_gemma3_lora_dp": ("hub_gemma3_lora", "dp8"),
    # issue 23: mixed_bfloat16 (MIXED), and Gemma's LoRA fine-tuning in it
    "hub_gpt2_mixed": ("hub_gpt2_mixed", "megatron"),
    "hub_gpt2_mixed_dp": ("hub_gpt2_mixed", "dp8"),
    "hub_llama_mixed": ("hub_llama_mixed", "layout_map"),
    "hub_llama_mixed_dp": ("hub_llama_mixed", "dp8"),
    "hub_gemma_mixed": ("hub_gemma_mixed", "layout_map"),
    "hub_gemma_mixed_dp": ("hub_gemma_mixed", "dp8"),
    "hub_gemma2_mixed": ("hub_gemma2_mixed", "layout_map"),  # Gemma 2's soft caps
    "hub_gemma2_mixed_dp": ("hub_gemma2_mixed", "dp8"),
    "hub_gemma_lora_mixed": ("hub_gemma_lora_mixed", "layout_map"),
    "hub_gemma_lora_mixed_dp": ("hub_gemma_lora_mixed", "dp8"),
    "hub_mistral_mixed": ("hub_mistral_mixed", "layout_map"),  # Llama's map, as hub_mistral
    "hub_mistral_mixed_dp": ("hub_mistral_mixed", "dp8"),
    "hub_qwen_mixed": ("hub_qwen_mixed", "layout_map"),  # its biases, as hub_qwen
    "hub_qwen_mixed_dp": ("hub_qwen_mixed", "dp8"),
    # (not among keras_hub.sh's cases, nor their fixtures: measured by hand)
    "hub_llama3_mixed": ("hub_llama3_mixed", "layout_map"),
    "hub_llama3_mixed_dp": ("hub_llama3_mixed", "dp8"),
    "hub_qwen3_mixed": ("hub_qwen3_mixed", "layout_map"),  # Llama's map, as hub_qwen3
    "hub_qwen3_mixed_dp": ("hub_qwen3_mixed", "dp8"),
    "hub_gemma3_mixed": ("hub_gemma3_mixed", "layout_map"),  # Gemma's split map, as hub_gemma3
    "hub_gemma3_mixed_dp": ("hub_gemma3_mixed", "dp8"),
    # issue 23: bfloat16 (BF16), and Gemma's LoRA fine-tuning in it
    "hub_gemma_bf16": ("hub_gemma_bf16", "layout_map"),
    "hub_gemma_bf16_dp": ("hub_gemma_bf16", "dp8"),
    "hub_llama_bf16": ("hub_llama_bf16", "layout_map"),
    "hub_llama_bf16_dp": ("hub_llama_bf16", "dp8"),
    "hub_gpt2_bf16": ("hub_gpt2_bf16", "megatron"),
    "hub_gpt2_bf16_dp": ("hub_gpt2_bf16", "dp8"),
    "hub_gemma_lora_bf16": ("hub_gemma_lora_bf16", "layout_map"),
    "hub_gemma_lora_bf16_dp": ("hub_gemma_lora_bf16", "dp8"),
    "hub_gemma2_bf16": ("hub_gemma2_bf16", "layout_map"),
    "hub_gemma2_bf16_dp": ("hub_gemma2_bf16", "dp8"),
    "hub_gpt2_lora_bf16_dp": ("hub_gpt2_lora_bf16", "dp8"),
    # Qwen 3 and Gemma 3: their query/key norms in bfloat16, Gemma 3's LoRA
    "hub_qwen3_bf16": ("hub_qwen3_bf16", "layout_map"),  # Llama's map, as hub_qwen3
    "hub_qwen3_bf16_dp": ("hub_qwen3_bf16", "dp8"),
    "hub_gemma3_bf16": ("hub_gemma3_bf16", "layout_map"),  # Gemma's split map, as hub_gemma3
    "hub_gemma3_bf16_dp": ("hub_gemma3_bf16", "dp8"),
    "hub_gemma3_lora_bf16": ("hub_gemma3_lora_bf16", "layout_map"),
    "hub_gemma3_lora_bf16_dp": ("hub_gemma3_lora_bf16", "dp8"),
}

# LoRA folder -> the model it fine-tunes (same hyper-parameters, seed, data)
LORA = {"hub_llama_lora": "hub_llama", "hub_gpt2_lora": "hub_gpt2",
        "hub_gemma_lora_mixed": "hub_gemma_mixed", "hub_gemma_lora_bf16": "hub_gemma_bf16",
        "hub_gpt2_lora_bf16": "hub_gpt2_bf16", "hub_qwen3_lora": "hub_qwen3",
        "hub_gemma3_lora": "hub_gemma3", "hub_gemma3_lora_bf16": "hub_gemma3_bf16"}
LORA_RANK = 4

# Attention key biases (GPT-2's): zero gradient in exact arithmetic, as
# run_ref.NOISE_WEIGHTS.
NOISE = r"layers/gpt2_backbone/layers/transformer_decoder(_\d+)?/_self_attention_layer/key_dense/vars/1"


# Per model, added to a case JSON's "hub" (what differs from keras-hub's
# defaults in how the case is made).
NOTES = {
    "hub_mistral": {"layout_map_note": "MistralBackbone has no get_layout_map: "
                    "LlamaBackbone.get_layout_map's (the same variable paths)"},
    "hub_qwen": {"start_note": "the query/key/value biases (zeros by keras-hub's "
                 f"initializer) set to normal(0, {QWEN_BIAS_STD}) draws before saving "
                 "(numpy default_rng(2), in task.weights order): model.keras and preset/ "
                 "hold them"},
    "hub_mistral_sw": {"layout_map_note": "MistralBackbone has no get_layout_map: "
                       "LlamaBackbone.get_layout_map's (the same variable paths)",
                       "fully_masked_effect": "measured once by hand: the initial weights "
                       "are hub_mistral's (window 32, first step loss 4.573551); zeroing "
                       "the queries with no key (keras's Softmax layer, keras-hub's path "
                       "without the fused op) instead of averaging changes the 4 batches' "
                       "initial losses by up to 1.9e-4 relative"},
    "hub_gemma2_sw": {"soft_cap_note": "attention_logit_soft_cap 2.0, "
                      "final_logit_soft_cap 1.0, as hub_gemma2",
                      "fully_masked_effect": "measured once by hand: averaging the values "
                      "for the queries with no key (the fused op's way) instead of zeroing "
                      "them changes the 4 batches' initial losses by up to 3.3e-3 relative"},
    "hub_gemma2": {"layout_map_note": "GemmaBackbone.get_layout_map's, its "
                   "'(query|key|value).kernel' entry split: query ('model', 'batch', None) "
                   "as Gemma's, key and value (None, 'batch', None): 2 key/value heads do "
                   "not split over 'model' (4); JAX refuses Gemma's own map "
                   "(IndivisibleError)",
                   "soft_cap_note": "attention_logit_soft_cap 2.0, final_logit_soft_cap 1.0: "
                   "at the start 11-13% of the attention scores and 9% of the final logits "
                   "(pre-cap largest 2.55) are beyond their cap"},
}
NOTES["hub_llama3"] = {
    "start_note": "the query and key kernels (normal(0, 0.02) by keras-hub's initializer) "
                  f"drawn again from normal(0, {LLAMA3_QK_STD}) before saving (numpy "
                  "default_rng(4), in task.weights order), so that the attention scores, "
                  "and with them the rotary embedding, matter: model.keras and preset/ "
                  "hold them",
    "rope_note": "Llama 3.1's rope scaling (LlamaRotaryEmbedding): frequency adjustment "
                 "factor 8, low/high frequency factors 1 and 4, pretraining length 8: of "
                 "head_dim 4's inverse frequencies 1 and 1e-2 (wavelengths 6.3 and 628 "
                 "steps), the first is smoothed to 0.205 and the second divided by 8"}
NOTES["hub_qwen3"] = {
    "layout_map_note": "Qwen3Backbone has no get_layout_map: LlamaBackbone.get_layout_map's "
                       "(the same variable paths; the query/key norms' scales replicated)",
    "start_note": "the query and key norms' scales (ones by keras-hub's initializer) set to "
                  f"uniform{QWEN3_NORM_RANGE} draws before saving (numpy default_rng(3), in "
                  "task.weights order): model.keras and preset/ hold them",
    "qk_norm_note": "Qwen3TransformerDecoder builds Qwen3Attention without its "
                    "layer_norm_epsilon: the query/key norms' epsilon is Qwen3Attention's "
                    "default 1e-5 (checked), the other norms' the backbone's 1e-6"}
NOTES["hub_gemma2_sw"]["layout_map_note"] = NOTES["hub_gemma2"]["layout_map_note"]
NOTES["hub_gemma3"] = {
    "layout_map_note": "Gemma3Backbone has no get_layout_map: GemmaBackbone.get_layout_map's "
                       "(the same variable paths; the query/key norms' scales replicated), "
                       "split as hub_gemma2's: 2 key/value heads do not split over 'model'",
    "start_note": "every RMS norm's scale (zeros by keras-hub's initializer; the norm "
                  "multiplies by 1 + scale) set to "
                  f"uniform{GEMMA3_NORM_RANGE} draws before saving (numpy default_rng(5), in "
                  "task.weights order): model.keras and preset/ hold them",
    "block_note": "one block, local (Gemma3Backbone: use_sliding_window_attention and "
                  "i % 6 < 5): sliding window 4, RotaryEmbedding(max_wavelength=1e4, "
                  "scaling_factor=local_rope_scaling_factor 2); the global blocks' "
                  "(1e6, global_rope_scaling_factor 8) unused here; the block's norms and "
                  "query/key norms have epsilon 1e-6 (Gemma3Backbone does not pass its "
                  "layer_norm_epsilon to them: checked)"}
NOTES["hub_gemma2_mixed"] = NOTES["hub_gemma2_bf16"] = NOTES["hub_gemma2"]
NOTES["hub_mistral_mixed"] = {"layout_map_note": NOTES["hub_mistral"]["layout_map_note"]}
NOTES["hub_qwen_mixed"] = NOTES["hub_qwen"]
NOTES["hub_llama3_mixed"] = NOTES["hub_llama3"]
NOTES["hub_qwen3_mixed"] = NOTES["hub_qwen3"]
NOTES["hub_gemma3_mixed"] = {k: v for k, v in NOTES["hub_gemma3"].items()}
NOTES["hub_qwen3_bf16"] = NOTES["hub_qwen3"]
NOTES["hub_gemma3_bf16"] = NOTES["hub_gemma3"]


def layout_map_spec(backbone_cls):
    """kdcc's distribution spec for backbone_cls.get_layout_map(mesh) on the
    (2,4) mesh with keras-hub's default axis names, read back from the
    LayoutMap keras-hub returns (regex -> axes, in its order)."""
    mesh = {"shape": [2, 4], "axis_names": ["batch", "model"]}
    dist = keras.distribution
    lm = backbone_cls.get_layout_map(
        dist.DeviceMesh(tuple(mesh["shape"]), mesh["axis_names"], dist.list_devices()[:8]))
    return {"distribution": "ModelParallel", "device_mesh": mesh, "batch_dim_name": "batch",
            "layout_map": {k: list(lm[k].axes) for k in lm}}


# MistralBackbone has no get_layout_map: Llama's, whose paths are Mistral's
# too (transformer_layer_<i>/self_attention/query/kernel, ...).
LAYOUT_MAP_OF = {"hub_mistral": M.LlamaBackbone, "hub_mistral_sw": M.LlamaBackbone,
                 "hub_mistral_mixed": M.LlamaBackbone, "hub_qwen3": M.LlamaBackbone,
                 "hub_qwen3_mixed": M.LlamaBackbone, "hub_qwen3_bf16": M.LlamaBackbone}


def gemma_gqa_map():
    """GemmaBackbone.get_layout_map's spec with its query/key/value entry in
    two: the query kernel as Gemma's ('model', 'batch', None), the key and
    value kernels (None, 'batch', None): hub_gemma2's 2 key/value heads do not
    split over 'model' (4), which JAX refuses (IndivisibleError)."""
    spec = layout_map_spec(M.GemmaBackbone)
    qkv = "decoder_block.*attention.*(query|key|value).kernel"
    lm = {}
    for k, v in spec["layout_map"].items():
        if k == qkv:
            lm["decoder_block.*attention.*query.kernel"] = v
            lm["decoder_block.*attention.*(key|value).kernel"] = [None] + v[1:]
        else:
            lm[k] = v
    assert len(lm) == len(spec["layout_map"]) + 1, spec
    spec["layout_map"] = lm
    return spec


def spec_of(case):
    model, how = CASES[case]
    if how == "dp8":
        return mm.DP_8
    if how == "megatron":
        return mm.model_parallel(GPT2_MEGATRON)
    base = LORA.get(model, model)
    if HALF.get(base, base) in ("hub_gemma2", "hub_gemma2_sw", "hub_gemma3"):
        return gemma_gqa_map()
    return layout_map_spec(LAYOUT_MAP_OF.get(base, MODELS[base][1]))


def build(model):
    """The task, compiled: Adam(LR), keras-hub's default loss and
    weighted_metrics (CausalLM.compile's "auto"); a BF16 model with its
    float32 model's initial weights rounded."""
    task_cls, backbone_cls, hp = MODELS[model]
    start = None
    if model in BF16:  # the float32 model's draws (the seed's), then assigned
        f32 = build(BF16[model])
        start = [(v.path, np.array(v)) for v in f32.weights]
        del f32
    task = task_cls(backbone=backbone_cls(**hp), preprocessor=None)
    if start:
        assert [p for p, _ in start] == [v.path for v in task.weights], (start, task.weights)
        for v, (_, a) in zip(task.weights, start):
            assert v.dtype == BF16_POLICY, (v.path, v.dtype)
            v.assign(a)  # rounded to nearest even, as from_preset(..., dtype=) loads
    if model in ("hub_qwen", "hub_qwen_mixed"):
        rng = np.random.default_rng(2)
        biases = [v for v in task.weights if v.path.endswith("/bias")]
        assert len(biases) == 3 * hp["num_layers"], [v.path for v in biases]
        for v in biases:
            v.assign(rng.normal(0, QWEN_BIAS_STD, v.shape).astype("float32"))
    if HALF.get(model, model) == "hub_llama3":
        rng = np.random.default_rng(4)
        qk = [v for v in task.weights if re.search(r"/(query|key)/kernel$", v.path)]
        assert len(qk) == 2 * hp["num_layers"], [v.path for v in task.weights]
        for v in qk:
            v.assign(rng.normal(0, LLAMA3_QK_STD, v.shape).astype("float32"))
    if HALF.get(model, model) == "hub_gemma3":
        rng = np.random.default_rng(5)
        scales = [v for v in task.weights if v.path.endswith("/scale")]
        assert len(scales) == 6 * hp["num_layers"] + 1, [v.path for v in task.weights]
        for v in scales:
            v.assign(rng.uniform(*GEMMA3_NORM_RANGE, v.shape).astype("float32"))
        for lyr in task.backbone.transformer_layers:  # (the epsilon kdcc gives them)
            att = lyr.attention
            assert lyr.layer_norm_epsilon == att.query_norm.epsilon == att.key_norm.epsilon == 1e-6
    if HALF.get(model, model) == "hub_qwen3":
        rng = np.random.default_rng(3)
        scales = [v for v in task.weights if v.path.endswith("_dense_layernorm/scale")]
        assert len(scales) == 2 * hp["num_layers"], [v.path for v in task.weights]
        for v in scales:
            v.assign(rng.uniform(*QWEN3_NORM_RANGE, v.shape).astype("float32"))
        for lyr in task.backbone.transformer_layers:  # (the epsilon kdcc gives them)
            att = lyr._self_attention_layer
            assert att._query_dense_layer_norm.epsilon == att._key_dense_layer_norm.epsilon == 1e-5
    compile_task(task, model)
    return task


def compile_task(task, model):
    """Adam(LR); a mixed model (MIXED) without metrics; a bfloat16 one (BF16)
    or one of SGD16 half_optimizer's, without metrics."""
    if model in BF16 or model in SGD16:
        task.compile(optimizer=half_optimizer(model), weighted_metrics=[])
    elif model in MIXED:
        task.compile(optimizer=keras.optimizers.Adam(LR), weighted_metrics=[])
    else:
        task.compile(optimizer=keras.optimizers.Adam(LR))


def lr_of(model):
    """The learning rate a model's cases train with."""
    return SGD16_LR if model in SGD16 else BF16_LR if model in BF16 else LR


def make_data(n=SAMPLES):
    """{input name: array}, labels. rng seed 0: every other row (at random)
    padded to a length in [4, SEQ); pad ids 0, other ids in [1, VOCAB)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, (n, SEQ)).astype("int32")
    lengths = np.where(rng.random(n) < 0.5, SEQ, rng.integers(4, SEQ, n))
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype("int32")
    ids = ids * mask
    last = rng.integers(1, VOCAB, (n, 1)).astype("int32")
    y = np.concatenate([ids[:, 1:], last], axis=1)
    return {"token_ids": ids, "padding_mask": mask}, y


def window_masked(task, x):
    """The "window" note of a case JSON's "hub" (None without a sliding window
    shorter than SEQ): per windowed block, the queries of the data (all rows)
    that keras-hub's own attention mask (its layers' mask code on x's
    padding_mask: padding, causal and window) leaves with no key, and what
    keras-hub computes for such a query."""
    bb = task.backbone
    pad = x["padding_mask"]
    h = np.zeros(pad.shape + (bb.hidden_dim,), "float32")
    blocks, window, gemma = {}, None, None
    for i, lyr in enumerate(bb.transformer_layers):
        kind = type(lyr).__name__
        if kind == "GemmaDecoderBlock" and lyr.use_sliding_window_attention \
                and lyr.sliding_window_size < SEQ:
            window, gemma = lyr.sliding_window_size, True
            m = lyr.attention._mask_sliding_window(lyr._compute_attention_mask(h, pad, None, 0))
        elif kind == "Gemma3DecoderBlock" and lyr.use_sliding_window_attention \
                and lyr.sliding_window_size < SEQ:
            window, gemma = lyr.sliding_window_size, True
            m = lyr.attention._mask_sliding_window(
                lyr._compute_attention_mask(h, pad, None, None, 0))
        elif kind == "MistralTransformerDecoder" and lyr.sliding_window is not None \
                and lyr.sliding_window < SEQ:
            window, gemma = lyr.sliding_window, False
            m = lyr._compute_self_attention_mask(h, pad, None, None, None)
        else:
            continue
        m = np.asarray(m).astype(bool)  # [row, query, key]
        empty = ~m.any(-1)
        blocks[str(i)] = {"queries_with_no_key": int(empty.sum()),
                          "rows": int(empty.any(-1).sum())}
    if not blocks:
        return None
    lengths = pad.sum(1)
    want = int(np.maximum(0, SEQ - (lengths + window - 1)).sum())
    assert all(b["queries_with_no_key"] == want for b in blocks.values()), (blocks, want)
    return {
        "window": window,
        "windowed_blocks": [int(i) for i in blocks],
        "window_note": f"a query at step i attends keys j with i - {window} < j <= i and "
                       f"padding_mask 1: a padded row of length L has no key left for "
                       f"its queries i >= L + {window - 1}; in these data "
                       f"{want} queries in {blocks[next(iter(blocks))]['rows']} of the "
                       f"{len(pad)} rows, in each windowed block (rows of length "
                       f"<= {SEQ - window}; they count in the loss as every padded step)",
        "fully_masked": "GemmaAttention on the CPU (no fused op) applies keras's Softmax "
                        "layer with the mask, which sets the masked probabilities to 0 "
                        "after the softmax (where(mask, p, 0)): such a query's attention "
                        "output is 0" if gemma else
                        "MistralAttention uses ops.dot_product_attention (JAX's fused "
                        "path, chosen on the CPU too), which sets masked scores to "
                        "-0.7 * float32 max: such a query's scores are all equal, its "
                        "output the average of the value vectors of all 16 steps",
    }


def save_preset(task, path):
    """task.save_to_preset(path), metadata.json's date fixed."""
    task.save_to_preset(path)
    meta_path = os.path.join(path, "metadata.json")
    with open(meta_path) as f:
        meta = json.load(f)
    meta["date_saved"] = mm.FIXED_DATE
    with open(meta_path, "w") as f:
        json.dump(meta, f, indent=4)


def weighted_layers(backbone):
    """The list save_lora_weights and load_lora_weights index: the backbone's
    sublayers that have weights, in _flatten_layers order."""
    return [lyr for lyr in backbone._flatten_layers(include_self=False) if lyr.weights]


def lora_h5(path):
    """{h5 dataset path: array} of a .lora.h5 (lora/vars/rank,
    lora/<index>/vars/lora_kernel_a, .../lora_kernel_b)."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda n, o: out.__setitem__(n, np.array(o))
                     if isinstance(o, h5py.Dataset) else None)
    return out


def lora_enable(task, case, mdir):
    """backbone.enable_lora(LORA_RANK), compiled again (the optimizer for the
    LoRA variables), its initial A and B written to mdir/initial.lora.h5 by
    save_lora_weights (checked equal when a case of the folder wrote it)."""
    bb = task.backbone
    bb.enable_lora(LORA_RANK)
    compile_task(task, LORA[CASES[case][0]])
    path = os.path.join(mdir, "initial.lora.h5")
    if not os.path.exists(path):
        bb.save_lora_weights(path)
    else:
        with tempfile.TemporaryDirectory() as d:
            bb.save_lora_weights(os.path.join(d, "i.lora.h5"))
            mine = lora_h5(os.path.join(d, "i.lora.h5"))
        theirs = lora_h5(path)
        assert mine.keys() == theirs.keys(), (mine.keys(), theirs.keys())
        for k in mine:
            assert np.array_equal(mine[k], theirs[k]), f"{case}: initial LoRA {k} differs"
    return {v.path: np.array(v) for v in task.weights}


def bf16_to_f32(a):
    """A bfloat16 dataset as h5py reads it (opaque 2-byte 'V2') as float32."""
    return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)


def lora_report(task, before, final, case, mdir, R):
    """After training: final.lora.h5 (or <case>.final.lora.h5 when it differs
    from the folder's first case), the checks (base kernels unchanged, every
    LoRA variable changed, the weights file's kernels merged W + scale A.B)
    and the case JSON's "lora"."""
    bb = task.backbone
    layers = weighted_layers(bb)
    after = {v.path: np.array(v) for v in task.weights}
    assert after.keys() == before.keys() and len(after) == len(task.weights)
    trainable = [v.path for v in task.trainable_weights]
    lora_vars = [p for p in after if p.rsplit("/", 1)[1] in ("lora_kernel_a", "lora_kernel_b")]
    frozen = [p for p in after if p not in trainable]
    base_same = all(np.array_equal(before[p], after[p]) for p in frozen)
    lora_changed = all(not np.array_equal(before[p], after[p]) for p in lora_vars)
    other_trained = [p for p in trainable if p not in lora_vars]
    assert base_same, f"{case}: a frozen variable changed"
    assert lora_changed, f"{case}: a LoRA variable did not change"
    assert set(lora_vars) <= set(trainable)
    layer_info, merged_worst = {}, 0.0
    mixed = LORA[CASES[case][0]] in HALF
    bf16 = LORA[CASES[case][0]] in BF16
    for i in bb._lora_enabled_layers:
        lyr = layers[i]
        w = np.array(lyr._kernel)
        merged = w + (lyr.lora_alpha / lyr.lora_rank) * np.matmul(
            np.array(lyr.lora_kernel_a), np.array(lyr.lora_kernel_b))
        # issue 23: under a mixed policy Keras 3.15 saves the merged kernel
        # cast to the compute dtype (EinsumDense._get_kernel_with_merged_lora:
        # ops.cast(kernel + scale * A.B, compute_dtype)), a bfloat16 dataset
        # (h5py's opaque 'V2'); kdcc writes the float32 merge. The case keeps
        # the float32 merge of keras-hub's final variables (final_merged_note)
        # after checking that the bfloat16 file holds it rounded.
        saved = {k: bf16_to_f32(a) if a.dtype.kind == "V" else a for k, a in final.items()}
        hits = [k for k, a in saved.items() if a.shape == merged.shape
                and R.max_rel(a, merged) <= (2.0 ** -8 if mixed else 1e-6)]
        assert len(hits) == 1, (case, lyr.path, hits)
        merged_worst = max(merged_worst, R.max_rel(saved[hits[0]], merged))
        if final[hits[0]].dtype.kind == "V":  # bfloat16 variables: kdcc writes it so too
            final[hits[0]] = merged.astype("float32") if not bf16 else saved[hits[0]]
        layer_info[str(i)] = {
            "layer": lyr.path, "class": type(lyr).__name__, "equation": lyr.equation,
            "kernel": [int(d) for d in w.shape],
            "lora_kernel_a": [int(d) for d in lyr.lora_kernel_a.shape],
            "lora_kernel_b": [int(d) for d in lyr.lora_kernel_b.shape],
            "weights_file_kernel": hits[0],
        }

    name, shared = "final.lora.h5", None
    path = os.path.join(mdir, name)
    with tempfile.TemporaryDirectory() as d:
        bb.save_lora_weights(os.path.join(d, "f.lora.h5"))
        mine = lora_h5(os.path.join(d, "f.lora.h5"))
        if os.path.exists(path):  # the folder's first case wrote one
            theirs = lora_h5(path)
            worst = max(R.max_rel(mine[k], theirs[k]) for k in theirs) \
                if mine.keys() == theirs.keys() else float("inf")
            if worst > 2e-5:
                name = case + ".final.lora.h5"
                path = os.path.join(mdir, name)
            else:
                shared = (f"the folder's first case's, {case}'s within {worst:.1e} "
                          "(relative to each tensor's max)")
        if not os.path.exists(path):
            bb.save_lora_weights(path)
    return {k: v for k, v in {
        "rank": LORA_RANK,
        "alpha": LORA_RANK,
        "scale": 1.0,
        "target_layer_names": bb.default_lora_layer_names(),
        "targets": [layers[i].path for i in bb._lora_enabled_layers],
        "layers": layer_info,
        "initial": "initial.lora.h5",
        "final": name,
        "final_note": shared,
        "final_merged_note": "mixed_bfloat16: keras-hub's save_weights writes each merged "
                             "kernel cast to bfloat16 (Keras 3.15's EinsumDense casts "
                             "W + scale * A.B to the compute dtype); final.npz holds the "
                             "float32 merge of its final variables instead (checked to round "
                             "to the saved bfloat16 within 2^-8 of each tensor's max), which "
                             "kdcc's --save-weights writes" if mixed and not bf16 else
                             "bfloat16: the kernel is a bfloat16 variable and keras-hub's "
                             "save_weights writes W + scale * A.B (A and B float32) cast to "
                             "bfloat16, as kdcc's --save-weights does; final.npz holds those "
                             "bfloat16 values" if bf16 else None,
        "trainable": trainable,
        "trainable_besides_lora": other_trained,
        "checks": {
            "frozen_unchanged": f"all {len(frozen)} frozen variables bit for bit equal "
                                "before and after training (the unmerged kernels too)",
            "lora_changed": f"all {len(lora_vars)} lora_kernel_a / lora_kernel_b changed",
            "merged_kernels": "the weights file's query/value kernels are W + scale * "
                              f"A.B (matmul over the rank) within {merged_worst:.1e}"
                              + (" (saved in bfloat16: see final_merged_note)"
                                 if mixed else ""),
        },
        "note": "backbone.enable_lora(4) (keras-hub 0.32): every backbone sublayer "
                "frozen, then each layer named in target_layer_names re-enabled "
                "(trainable) with EinsumDense.enable_lora(4): its kernel frozen, "
                "lora_kernel_a [kernel dims but the last..., rank] (he_uniform) and "
                "lora_kernel_b [rank, kernel's last dim] (zeros), float32; kernel used = "
                "W + (alpha / rank) * matmul(A, B), alpha = rank. A bias of a target layer "
                "(GPT-2's) stays trainable. model.keras is the task before enable_lora "
                "(LoRA is not in its config): kdcc model.keras --lora-rank 4, the program "
                "--lora-weights initial.lora.h5. final weights: the task's save_weights "
                "(merged kernels, no LoRA variables); the .lora.h5 files hold A and B by "
                "index in the backbone's weighted sublayers (save_lora_weights)",
    }.items() if v is not None}


def float32_losses(case, keras_path, mdir, x, y, R, twin_of=None):
    """issue 23: every step's loss of a 16-bit case's float32 twin (HALF: the
    same task without the policy; twin_of: another, the bfloat16 cases'
    mixed_bfloat16 one) trained from the case's initial weights
    (keras_path; with LoRA, enable_lora and the case's initial A and B), as
    the case trains (its optimizer), under the case's distribution."""
    model_name = CASES[case][0]
    base = LORA.get(model_name, model_name)
    keras.utils.set_random_seed(mm.SEED)
    twin = build(twin_of or HALF[base])
    if base in BF16 or base in SGD16:
        compile_task(twin, base)
    twin.load_weights(keras_path)
    if base != model_name:
        twin.backbone.enable_lora(LORA_RANK)
        compile_task(twin, base)
        twin.backbone.load_lora_weights(os.path.join(mdir, "initial.lora.h5"))
    losses = []
    for _ in range(EPOCHS):
        for s in range(SAMPLES // R.BATCH):
            sl = slice(s * R.BATCH, (s + 1) * R.BATCH)
            logs = twin.train_on_batch({k: v[sl] for k, v in x.items()}, y[sl],
                                       return_dict=True)
            losses.append(float(logs["loss"]))
    return losses


# hub_gemma3's variants: keras-hub's loss on each batch of the data (16
# rows, test_on_batch: no step taken) from the case's initial weights
# (model.keras) under another setting. keras_hub.sh checks "global" (the
# block global: rotary wavelength 1e6 by global_rope_scaling_factor 8, no
# window) against kdcc's preset so edited, trained at rate 0; the others say
# how far the losses move were a part lost (so that the case can fail).
GEMMA3_VARIANTS = {"as_is": {}, "global": {"use_sliding_window_attention": False},
                   "no_query_key_norm": {"use_query_key_norm": False},
                   "no_window": {"sliding_window_size": SEQ}}
# issue 23: a 16-bit Gemma 3 case's (policy: its dtype), each with
# float32_batch_losses, the same config and weights without the policy
GEMMA3_HALF_VARIANTS = {k: GEMMA3_VARIANTS[k] for k in ("as_is", "global")}


def gemma3_variants(keras_path, x, y, R, policy=None):
    _, backbone_cls, hp = MODELS["hub_gemma3"]
    start = {v.path: np.array(v) for v in keras.saving.load_model(keras_path).weights}

    def losses(change, dtype):
        t = M.Gemma3CausalLM(backbone=backbone_cls(**dict(hp, **change, dtype=dtype)),
                             preprocessor=None)
        t.compile(optimizer=keras.optimizers.Adam(LR))
        for v in t.weights:
            v.assign(start[v.path])
        out = []
        for s in range(SAMPLES // R.BATCH):
            sl = slice(s * R.BATCH, (s + 1) * R.BATCH)
            out.append(float(t.test_on_batch({k: a[sl] for k, a in x.items()}, y[sl],
                                             return_dict=True)["loss"]))
        return out

    out = {}
    for name, change in (GEMMA3_HALF_VARIANTS if policy else GEMMA3_VARIANTS).items():
        out[name] = {"config_change": change, "batch_losses": losses(change, policy)}
        if policy:
            out[name]["float32_batch_losses"] = losses(change, None)
    for v in out.values():
        v["max_relative_change_from_as_is"] = max(
            abs(a - b) / abs(b) for a, b in zip(v["batch_losses"], out["as_is"]["batch_losses"]))
    out["note"] = ("keras-hub's loss on each batch of 16 rows (test_on_batch) from model.keras's "
                   "weights with the backbone's config so changed; keras_hub.sh compiles the "
                   "preset with 'global''s change and checks kdcc's losses at rate 0"
                   + (f" (under {policy}, within rtol and at least float32_min_distance times "
                      "keras-hub's own distance from float32_batch_losses away from them)"
                      if policy else ""))
    return out


def run_case(case, out, R):
    """One of CASES, written under out/<model>/; R is run_ref (its helpers
    and writers), so the JSON is run_case's."""
    model_name, _how = CASES[case]
    base = LORA.get(model_name, model_name)
    task_cls, backbone_cls, hp = MODELS[base]
    mixed, bf16 = base in HALF, base in BF16  # (mixed: any 16-bit policy)
    spec = spec_of(case)
    mdir = os.path.join(out, model_name)
    os.makedirs(mdir, exist_ok=True)
    x, y = make_data()
    keras.backend.clear_session()
    keras.utils.set_random_seed(mm.SEED)
    keras.distribution.set_distribution(mm.make_distribution(spec))
    try:
        task = build(base)
        bb_name = task.backbone.name
        in_names = [t._keras_history[0].name for t in task.inputs]  # Keras's order
        xs = [x[nm] for nm in in_names]
        xf, yf = [nm + ".npy" for nm in in_names], ["y.npy"]
        inputs, outputs = R.io_description(task, xs, [y], xf, yf)
        keras_path = os.path.join(mdir, "model.keras")
        if not os.path.exists(keras_path):
            mm.save_archive(task, keras_path, True)
            if base == model_name:  # (a LoRA folder's model is base's)
                save_preset(task, os.path.join(mdir, "preset"))
            for a, f in zip(xs + [y], xf + yf):
                np.save(os.path.join(mdir, f), a)
        else:  # a second case of the model: same initial weights, same data
            with tempfile.TemporaryDirectory() as d:
                mm.save_archive(task, os.path.join(d, "m.keras"), True)
                mine = R.archive_weights(os.path.join(d, "m.keras"))
            theirs = R.archive_weights(keras_path)
            assert mine.keys() == theirs.keys(), (mine.keys(), theirs.keys())
            for k in mine:
                assert np.array_equal(mine[k], theirs[k]), f"{case}: initial {k} differs"
            for a, f in zip(xs + [y], xf + yf):
                assert np.array_equal(np.load(os.path.join(mdir, f)), a), f"{case}: {f} differs"
        base_keras = os.path.join(out, base, "model.keras")
        if base != model_name and os.path.exists(base_keras):  # LoRA: the same start
            mine, theirs = R.archive_weights(keras_path), R.archive_weights(base_keras)
            assert mine.keys() == theirs.keys() and all(
                np.array_equal(mine[k], theirs[k]) for k in mine), f"{case}: not {base}'s"
        f32_keras = os.path.join(out, HALF[base], "model.keras") if mixed else None
        same_start = None
        if f32_keras and os.path.exists(f32_keras):  # the float32 folder's start?
            mine, theirs = R.archive_weights(keras_path), R.archive_weights(f32_keras)
            if bf16:  # rounded to bfloat16 (nearest even)
                theirs = {k: np.asarray(jax.numpy.asarray(a, "bfloat16"), "float32")
                          for k, a in theirs.items()}
            same_start = mine.keys() == theirs.keys() and all(
                np.array_equal(mine[k], theirs[k]) for k in mine)
        before = lora_enable(task, case, mdir) if base != model_name else None

        step_loss, step_logs = [], {}
        steps = SAMPLES // R.BATCH
        for _ in range(EPOCHS):
            for s in range(steps):
                sl = slice(s * R.BATCH, (s + 1) * R.BATCH)
                logs = task.train_on_batch({k: v[sl] for k, v in x.items()}, y[sl],
                                           return_dict=True)
                step_loss.append(float(logs["loss"]))
                for k, v in logs.items():
                    step_logs.setdefault(k, []).append(float(v))
        metrics = [k for k in step_logs if k != "loss"]
        metric = metrics[0] if metrics else None
        epoch_logs = {k: [float(np.mean(v[e * steps:(e + 1) * steps])) for e in range(EPOCHS)]
                      for k, v in step_logs.items()}
        # keras.Model's evaluate: keras-hub's (PipelineModel) wants grain or
        # tf.data for arrays even with no preprocessor; this is what it
        # hands them to.
        ev = keras.Model.evaluate(task, x, y, batch_size=R.BATCH, verbose=0, return_dict=True)
        ev = {k: float(v) for k, v in ev.items()}
        with tempfile.TemporaryDirectory() as d:
            wpath = os.path.join(d, "final.weights.h5")
            task.save_weights(wpath)
            final = R.layer_weights(wpath)
        lora = lora_report(task, before, final, case, mdir, R) if before else None
        window = window_masked(task, x)
        variants = gemma3_variants(keras_path, x, y, R, hp.get("dtype")) \
            if HALF.get(base, base) == "hub_gemma3" else None
        f32_loss = float32_losses(case, keras_path, mdir, x, y, R) if mixed else None
        mixed_loss = float32_losses(case, keras_path, mdir, x, y, R,
                                    MIXED_OF[HALF[base]]) if bf16 else None
    finally:
        keras.distribution.set_distribution(None)

    # (LoRA freezes the key biases; under a mixed policy both runs' key-bias
    # updates are rounding noise: twice the bound, as run_ref.py's; under SGD
    # a step is the rate times that noise: keras-hub's bfloat16 GPT-2 ends
    # with them under 5e-8, its two meshes 1e-7 apart)
    noise = 1e-6 if base in SGD16 else lr_of(base) * len(step_loss) * (2 if mixed else 1)
    atol = {} if lora else {k: noise for k in sorted(final) if re.fullmatch(NOISE, k)}
    final_name, note = R.write_final(mdir, case, model_name, final, atol, spec)
    ref = {
        "case": case,
        "model": model_name,
        "distribution": case + ".dist.json",
        "devices": int(np.prod(spec["device_mesh"]["shape"])),
        "versions": f"keras {keras.__version__}, keras-hub {keras_hub.__version__}, "
                    f"jax {jax.__version__}",
        "samples": SAMPLES,
        "batch_size": R.BATCH,
        "epochs": EPOCHS,
        "shuffle": False,
        "dropout": "dropout 0 in the backbone's config",
        "metric": metric,
        "step_loss": step_loss,
        "step_metric": step_logs[metric] if metric else [],
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
                      "--batch-size", str(R.BATCH)],
        "program_args": R.program_args(xf, yf, None, None, EPOCHS),
        "program_args_named": R.program_args(xf, yf, [i["name"] for i in inputs],
                                             [o["name"] for o in outputs], EPOCHS),
        "hub": {
            "task": task_cls.__name__,
            "backbone": backbone_cls.__name__,
            "backbone_config": hp,
            "sequence_length": SEQ,
            "inputs_dict": "the task takes {token_ids, padding_mask}; model.inputs "
                           "(and x_files) flatten it by sorted key",
            "padding": "padding_mask: 1 then trailing 0s on padded rows (token id 0 "
                       "there); it masks attention (with the causal mask), not the "
                       "loss: no sample_weight",
            "labels": "the next token: token_ids shifted left one, a fresh id last",
            "compile": f"Adam({LR}) given; loss and weighted_metrics keras-hub's "
                       "CausalLM.compile defaults (SparseCategoricalCrossentropy("
                       "from_logits=True), [SparseCategoricalAccuracy])",
            "preset": "preset",
            "preset_note": "task.save_to_preset() of the initial weights: config.json "
                           "(backbone), task.json, metadata.json, model.weights.h5 "
                           "(backbone weights: layers/... without the task's "
                           f"layers/{bb_name}/ prefix); no compile settings: keras-hub's "
                           "defaults are Adam(2e-5), so these numbers need --lr "
                           f"{LR} from it",
        },
    }
    if base in NOTES:
        ref["hub"].update(NOTES[base])
    if mixed:
        initial = os.path.join(mdir, "initial.npz")
        if not os.path.exists(initial):
            np.savez_compressed(initial, **R.archive_weights(keras_path))
        ref.update(
            dtype_policy=BF16_POLICY if bf16 else MIXED_POLICY, rtol=R.MIXED_RTOL,
            update_rtol=R.PURE_UPDATE_RTOL if bf16 else R.MIXED_UPDATE_RTOL,
            initial_weights="initial.npz", float32_step_loss=f32_loss,
            float32_min_distance=R.MIXED_FROM_F32,
            mixed_note=("mixed precision: losses within rtol, the training update (final "
                        "minus initial weights) within update_rtol in norm per tensor, and "
                        "the step losses at least float32_min_distance times keras-hub's "
                        "own distance from its float32 run (float32_step_loss: the same "
                        f"task without the policy, {HALF[base]}'s hyper-parameters, from "
                        "these initial weights"
                        + (" and LoRA A and B" if lora else "") + ") away from that run"
                        + ("; mixed_step_loss likewise: its mixed_bfloat16 twin (float32 "
                           "variables) from the same weights, mixed_min_distance" if bf16
                           else "")))
        ref["hub"]["mixed"] = (
            f"the backbone built with dtype='{BF16_POLICY if bf16 else MIXED_POLICY}' "
            "(every layer's policy); compiled with weighted_metrics=[] (no accuracy: a "
            "bf16 rounding may flip an argmax)")
        if same_start is not None:
            ref["hub"]["same_initial_weights_as"] = HALF[base] if same_start else None
            ref["hub"]["same_initial_weights_note"] = (
                f"model.keras's weights {'equal' if same_start else 'differ from'} "
                f"{HALF[base]}/model.keras's " + (
                    "rounded to bfloat16 (the float32 model's initial weights assigned to "
                    "the bfloat16 variables, as from_preset(..., dtype='bfloat16') loads "
                    "a float32 preset)" if bf16 else
                    "(same seed; the variables are float32 under either policy)"))
    if bf16 or base in SGD16:
        ref["hub"]["learning_rate"] = lr_of(base)  # (the program's --lr for a preset)
        ref["hub"]["compile"] = (
            (f"AdamW({BF16_LR}, beta_2=0.99) given (keras-hub's fine-tuning guides' optimizer; "
             "Keras's default beta_2 0.999 is 1 in bfloat16, which moves no bfloat16 "
             "variable)" if base not in SGD16 else
             f"SGD({lr_of(base)}, momentum=0.9) given (under AdamW the attention's query and "
             "key kernels, near-zero gradients at the start, take steps of the rate: "
             "keras-hub's own two meshes end far apart there"
             + ("; Gemma 3's query norm's scale likewise under Adam" if "gemma3" in base else "")
             + ")")
            + ", keras-hub's default loss, no metrics")
    if base in SGD16 and not bf16:
        ref["hub"]["preset_note"] = (
            "task.save_to_preset() of the initial weights (config.json's dtype "
            f"{MIXED_POLICY}); no compile settings: keras_hub.sh compiles it with this "
            "case's optimizer in task.json (model.keras's compile_config) and "
            "hub.learning_rate")
    if bf16:
        ref.update(mixed_step_loss=mixed_loss, mixed_min_distance=R.MIXED_FROM_F32)
        ref["hub"]["preset_note"] = (
            "task.save_to_preset() of the initial weights (config.json's dtype bfloat16, "
            "model.weights.h5 in bfloat16); no compile settings: keras-hub's default "
            "Adam(2e-5) moves no bfloat16 variable, so keras_hub.sh compiles it with this "
            "case's optimizer in task.json (model.keras's compile_config)")
    if window:
        ref["hub"].update(window)
    if variants:
        ref["hub"]["variants"] = variants
    if lora:
        ref["lora"] = lora
        ref["kdcc_args"] += ["--lora-rank", str(LORA_RANK)]
        for k in ("program_args", "program_args_named"):
            ref[k] += ["--lora-weights", "initial.lora.h5"]
        ref["hub"]["preset"] = None
        ref["hub"]["preset_note"] = (f"none here: {base}/preset is the same model "
                                     "(model.keras's initial weights are checked equal)")
    if note:
        ref["final_weights_note"] = note
    return R.finish_ref(mdir, case, ref, atol)


# ---------------------------------------------------------------------------
# Greedy generation (issue 24): keras-hub's generate() of each tiny model
# with its initial weights (model.keras), for kdcc's generate to match token
# for token. Written by
#
#     python3 tests/keras_ref/hub_models.py --generate [--out DIR]
#
# into OUT/hub_<model>/generate/ (default OUT: tests/fixtures/keras_hub).

GEN_LENGTHS = (3, 8, 5, 6)  # the prompts' lengths, right-padded to SEQ


def generate_inputs():
    """token_ids and padding_mask (int32, 4 x SEQ): rng seed 1, ids in
    [1, VOCAB), the prompts of GEN_LENGTHS left-aligned, pads 0."""
    rng = np.random.default_rng(1)
    ids = rng.integers(1, VOCAB, (len(GEN_LENGTHS), SEQ)).astype("int32")
    mask = (np.arange(SEQ)[None, :] < np.array(GEN_LENGTHS)[:, None]).astype("int32")
    return ids * mask, mask


def greedy_by_forward(task, ids, mask):
    """Greedy continuation of each row by whole forward passes (no cache):
    position t's token = argmax of the logits at t - 1, for t from the row's
    length to SEQ - 1. Returns the tokens and, per generated token, the logit
    gap between the chosen id and the runner-up."""
    ids = ids.copy()
    gaps = []
    for t in range(int(mask.sum(1).min()), SEQ):
        logits = np.asarray(task.predict_on_batch(
            {"token_ids": ids, "padding_mask": np.ones_like(ids)}))[:, t - 1, :]
        for r in range(len(ids)):
            if not mask[r, t]:
                top = np.sort(logits[r])[::-1]
                gaps.append(float(top[0] - top[1]))
                ids[r, t] = int(np.argmax(logits[r]))
    return ids, gaps


def write_generate(model_name, out):
    d = os.path.join(out, model_name, "generate")
    os.makedirs(d, exist_ok=True)
    keras.backend.clear_session()
    task = keras.saving.load_model(os.path.join(FIXTURES, model_name, "model.keras"))
    task.compile(sampler="greedy")
    if isinstance(task, M.Gemma3CausalLM):  # its text model's generate_step returns
        step = task.generate_step            # images etc. None, which generate's
                                             # output normalizing cannot take: dropped
        task.generate_step = lambda inputs, stop_token_ids=None: {
            k: v for k, v in step(inputs, stop_token_ids).items() if v is not None}
    ids, mask = generate_inputs()
    got = task.generate({"token_ids": ids, "padding_mask": mask}, max_length=SEQ,
                         stop_token_ids=None)
    out_ids, out_mask = np.asarray(got["token_ids"]), np.asarray(got["padding_mask"])
    again = task.generate({"token_ids": ids, "padding_mask": mask}, max_length=SEQ,
                         stop_token_ids=None)
    assert np.array_equal(again["token_ids"], out_ids), f"{model_name}: generate not deterministic"
    fwd, gaps = greedy_by_forward(task, ids, mask)
    assert np.array_equal(fwd, out_ids), f"{model_name}: cached generate != whole forward passes"
    assert np.array_equal(out_ids[mask == 1], ids[mask == 1]), "the prompt was overwritten"
    files = {"token_ids": "token_ids.npy", "padding_mask": "padding_mask.npy",
             "out_token_ids": "out_token_ids.npy", "out_padding_mask": "out_padding_mask.npy"}
    for k, a in (("token_ids", ids), ("padding_mask", mask), ("out_token_ids", out_ids),
                 ("out_padding_mask", out_mask)):
        np.save(os.path.join(d, files[k]), a)
    ref = {
        "model": model_name,
        "weights": f"../model.keras (the initial weights, as {model_name}'s training cases start)",
        "versions": f"keras {keras.__version__}, keras-hub {keras_hub.__version__}, "
                    f"jax {jax.__version__}",
        "call": "task.compile(sampler='greedy'); task.generate({'token_ids': token_ids, "
                "'padding_mask': padding_mask}, max_length=16, stop_token_ids=None)  # "
                "preprocessor=None: "
                "max_length is ignored, the window is token_ids' width",
        "files": files,
        "dtypes": {"token_ids": "int32", "padding_mask": "int32 (1 then 0s)",
                   "out_token_ids": str(out_ids.dtype),
                   "out_padding_mask": f"{out_mask.dtype} (as generate returns it)"},
        "prompt_lengths": list(GEN_LENGTHS),
        "window": SEQ,
        "steps": SEQ - min(GEN_LENGTHS),
        "semantics": "the prompts right-padded (pad id 0). The cache is seeded by one "
                     "forward pass over the whole window (causal mask only, pads included); "
                     f"then for index from min(prompt lengths) = {min(GEN_LENGTHS)} to "
                     f"{SEQ - 1}: the token at index - 1 is run at position index - 1 "
                     "against the cache (its key/value written there), the next id is "
                     "argmax(softmax(logits)) (GreedySampler), and it is written at index "
                     "only where the input padding_mask is 0: a longer row keeps its "
                     "prompt (its cache entries come from its own prompt ids). So each "
                     "row is its prompt then its own greedy continuation to the window's "
                     "end, the same as whole causal forward passes (checked). No stop "
                     "token: it runs to the end; out_padding_mask is all True "
                     "(ones_like(token_ids, bool)); the prompt positions are unchanged",
        "logit_gap_min": min(gaps),
        "logit_gap_note": "the smallest difference between the chosen id's logit and the "
                          "runner-up's over the generated tokens (of whole forward passes): "
                          "how close a token-for-token comparison is to a tie",
    }
    with open(os.path.join(d, "generate.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(f"{model_name}: generated {ref['steps']} steps, smallest logit gap "
          f"{min(gaps):.2e}\n{out_ids}")
    return ref


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--generate", action="store_true", required=True,
                    help="write the greedy generation references")
    ap.add_argument("--out", default=FIXTURES)
    ap.add_argument("--models", nargs="*", default=[m for m in MODELS if m not in HALF])
    a = ap.parse_args()
    for m in a.models:
        write_generate(m, a.out)
