#!/usr/bin/env python3
"""A Keras 3 model JSON of a deep MLP, for timing how kdcc's builds grow with
the model (bench/build_time.sh):

    bench/deep_mlp.py --layers 1000 --units 64 > deep.json

LAYERS Dense layers of UNITS relu units on a [UNITS] input, then Dense 10 with
softmax; Adam, sparse categorical crossentropy, accuracy. The JSON has the
shape `model.to_json()` writes (kdcc reads nothing else), built from the wide
MLP's (models/wide_mlp.json) layer records, so no Keras is needed."""
import argparse
import copy
import json
import os

ap = argparse.ArgumentParser()
ap.add_argument("--layers", type=int, default=1000)
ap.add_argument("--units", type=int, default=64)
args = ap.parse_args()

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
with open(os.path.join(root, "models", "wide_mlp.json")) as f:
    base = json.load(f)
inp, dense = base["config"]["layers"][0], base["config"]["layers"][1]


def dense_layer(i, units, activation, fan_in):
    d = copy.deepcopy(dense)
    d["config"].update(name="dense_%d" % i, units=units, activation=activation)
    d["build_config"] = {"input_shape": [None, fan_in]}
    return d


U = args.units
layers = [copy.deepcopy(inp)]
layers[0]["config"]["batch_shape"] = [None, U]
layers += [dense_layer(i, U, "relu", U) for i in range(args.layers)]
layers.append(dense_layer(args.layers, 10, "softmax", U))
model = copy.deepcopy(base)
model["config"]["name"] = "deep_mlp_%d" % args.layers
model["config"]["layers"] = layers
model["config"]["build_input_shape"] = [None, U]
model["build_config"] = {"input_shape": [None, U]}
model["compile_config"]["optimizer"] = {
    "module": "keras.optimizers", "class_name": "Adam", "registered_name": None,
    "config": {"name": "adam", "learning_rate": 0.001, "weight_decay": None, "clipnorm": None,
               "global_clipnorm": None, "clipvalue": None, "use_ema": False, "ema_momentum": 0.99,
               "ema_overwrite_frequency": None, "loss_scale_factor": None,
               "gradient_accumulation_steps": None, "beta_1": 0.9, "beta_2": 0.999,
               "epsilon": 1e-07, "amsgrad": False}}
model["compile_config"]["loss"]["config"]["from_logits"] = False
model["compile_config"]["metrics"] = ["accuracy"]
print(json.dumps(model))
