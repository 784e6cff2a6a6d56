#!/usr/bin/env python3
"""Write examples/gemma_lora/preset/: a small random Gemma, as keras-hub saves
a preset (config.json, the backbone's hyper-parameters; task.json, the
GemmaCausalLM; metadata.json; model.weights.h5, its weights). It is committed,
so the example needs no Python; this script (keras-hub 0.32 on JAX, see
tests/keras_ref/requirements*.txt) is how it was made:

    python3 examples/gemma_lora/make_preset.py

The vocabulary is 128 ids: the example feeds text as bytes (ids = the text's
distinct bytes in increasing order, as examples/char_gpt does), not Gemma's
tokenizer, so the task has no preprocessor."""
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras  # noqa: E402
import keras_hub  # noqa: E402

keras.utils.set_random_seed(2026)
backbone = keras_hub.models.GemmaBackbone(
    vocabulary_size=128, num_layers=2, num_query_heads=4, num_key_value_heads=2,
    hidden_dim=64, intermediate_dim=256, head_dim=16, dropout=0.0)
task = keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None)
out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "preset")
task.save_to_preset(out)
print("wrote", out, backbone.count_params(), "parameters")
