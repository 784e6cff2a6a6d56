#!/usr/bin/env bash
# issue 11: the noise layers (GaussianNoise, GaussianDropout,
# SpatialDropout1D/2D) act in training only. Against the same model with
# every rate and stddev 0 (the same variables, so the same initial weights
# from --seed): evaluate gives exactly the same numbers, on one device and
# on a (2,4) mesh, while a training step does not (the noise is drawn).
# Their draws are the same on any mesh: tests/sh/mesh_equiv.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=build/tests/noise_identity
mkdir -p $out
python3 - tests/gradcheck/noise_norms.json $out/quiet.json <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for layer in m["config"]["layers"]:
    for key in ("rate", "stddev"):
        if key in layer["config"]:
            layer["config"][key] = 0.0
json.dump(m, open(sys.argv[2], "w"))
PY
fail=0
for np_mesh in 1:data=1,model=1 8:data=2,model=4; do
  np=${np_mesh%%:*} mesh=${np_mesh#*:}
  for m in noisy quiet; do
    src=tests/gradcheck/noise_norms.json; [ $m = quiet ] && src=$out/quiet.json
    ./kdcc $src --distribution tests/good/noise_norms.dist.json --mesh $mesh --batch-size 8 -w \
      -o $out/$m
    for e in 0 1; do
      timeout 300 mpirun -np $np --oversubscribe $out/$m --synthetic 24 --epochs $e --quiet \
        --history $out/$m.$e.json
    done
  done
  python3 - $out <<'PY' || fail=1
import json, sys
d = sys.argv[1]
h = {(m, e): json.load(open(f"{d}/{m}.{e}.json")) for m in ("noisy", "quiet") for e in (0, 1)}
same = h["noisy", 0]["evaluate"] == h["quiet", 0]["evaluate"]
differ = h["noisy", 1]["step_loss"] != h["quiet", 1]["step_loss"]
print(f"noise_identity: evaluate {'identical' if same else 'DIFFERS'} "
      f"({h['noisy', 0]['evaluate']['loss']}), training {'differs' if differ else 'IDENTICAL'}")
sys.exit(0 if same and differ else 1)
PY
done
exit $fail
