#!/usr/bin/env bash
# generate.sh: `./train generate` on the bundled GPT (models/gpt.keras, its
# weights from the archive). Greedy decoding (--temperature 0) gives, token
# by token, the argmax of what `./train predict` gives for the sequence so
# far (checked here with one predict per token); greedy and sampled text
# (--temperature, --top-k, --seed, --samples) are the same on one device and
# on the (2,4) Megatron mesh, with the decode step's key/value cache and
# without (--no-cache), and prompts of different lengths share a batch;
# text through --vocab; and bad requests end with a message and status 1
# or 2.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin generate.sh
run() { # run NP EXE ARGS...: stdout in $T/out (stderr too), status in $rc
  local np=$1 exe=$2
  shift 2
  timeout 300 mpirun -np "$np" "$exe" "$@" >"$T/out" 2>"$T/err"
  rc=$?
  cat "$T/err" >>"$T/out"
}

./kdcc models/gpt.keras --batch-size 8 -w -o "$T/one" || exit 1
./kdcc models/gpt.keras --distribution models/gpt.dist.json --batch-size 8 -w -o "$T/mesh" || exit 1

# Greedy, on one device and on the mesh.
GREEDY=(generate --prompt-ids 5,9,2 --tokens 6 --temperature 0 -q)
name="greedy, one device"; run 1 "$T/one" "${GREEDY[@]}"; expect 0
cp "$T/out" "$T/greedy1"
name="greedy, mesh (2,4)"; run 8 "$T/mesh" "${GREEDY[@]}"; expect 0
cmp -s "$T/out" "$T/greedy1" || fail "greedy: the mesh gives $(cat "$T/out"), one device $(cat "$T/greedy1")"

# The same tokens from predict: the argmax at the last position, each time.
python3 - "$T" "$(cat "$T/greedy1")" <<'PY' || fail "greedy decoding is not predict's argmax"
import array, ast, struct, subprocess, sys
tmp, got = sys.argv[1], [int(t) for t in sys.argv[2].split()]
seq, T = got[:3], 16
sys.path.insert(0, "tests")
from npylite import save_npy  # noqa: E402
def write_ids(path, ids):
    save_npy(path, "<i4", "i", (1, T), ids + [0] * (T - len(ids)))
def read_floats(path):
    b = open(path, "rb").read()
    hl = struct.unpack("<H", b[8:10])[0]
    header = ast.literal_eval(b[10:10 + hl].decode())
    return header["shape"], array.array("f", b[10 + hl:])
while len(seq) < len(got):
    write_ids(tmp + "/x.npy", seq)
    subprocess.run([tmp + "/one", "predict", "--x", tmp + "/x.npy", "--out", tmp + "/p.npy", "-q"], check=True)
    shape, p = read_floats(tmp + "/p.npy")
    V, pos = shape[2], len(seq) - 1
    row = p[pos * V:(pos + 1) * V]
    seq.append(max(range(V), key=lambda i: row[i]))
assert seq == got, (seq, got)
print("generate.sh: greedy =", got, "= predict's argmax, token by token")
PY

# Sampled: the same draws on any mesh, another seed other draws.
SAMPLE=(generate --prompt-ids 1 --tokens 12 --temperature 0.8 --top-k 8 --samples 3 -q)
name="sampled, one device"; run 1 "$T/one" "${SAMPLE[@]}" --seed 7; expect 0
cp "$T/out" "$T/s1"
[ "$(wc -l <"$T/s1")" = 3 ] || fail "--samples 3 gave $(wc -l <"$T/s1") lines"
name="sampled, mesh (2,4)"; run 8 "$T/mesh" "${SAMPLE[@]}" --seed 7; expect 0
cmp -s "$T/out" "$T/s1" || fail "sampled: the mesh draws other tokens"
name="sampled, another seed"; run 1 "$T/one" "${SAMPLE[@]}" --seed 8; expect 0
cmp -s "$T/out" "$T/s1" && fail "--seed 8 draws what --seed 7 drew"

# The decode step (a key/value cache, kdcc's decode.c, filled by the
# prefill step, prefill.c): the program has both and says it uses them; --no-cache (the whole window each token) gives the
# same tokens, greedy and sampled, on one device and on the mesh; prompts
# of different lengths in one batch each continue as they do alone; past
# the window (positions that would slide) the whole window takes over, the
# same tokens as --no-cache.
for f in decode prefill; do
  [ -f "$T/one.kdcc.d/$f.c" ] && [ -f "$T/mesh.kdcc.d/$f.c" ] || fail "the GPT's programs have no $f.c"
done
./kdcc models/gpt.keras --distribution models/gpt.dist.json --batch-size 8 -w -S "$T/src" &&
  mpicc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -Iruntime "$T/src/decode.c" &&
  mpicc -std=c11 -pedantic -Wall -Wextra -Werror -fsyntax-only -Iruntime "$T/src/prefill.c" ||
  fail "-S DIR: no decode.c or prefill.c, or one does not compile warning-free"
name="greedy with the cache"; run 1 "$T/one" "${GREEDY[@]:0:7}"
expect 0 "the decode step, one position a token (4 key/value caches, filled by the prefill step)"
head -1 "$T/out" | cmp -s - "$T/greedy1" || fail "greedy: $(head -1 "$T/out") without -q"
for np in 1 8; do
  exe=$T/one && [ $np = 8 ] && exe=$T/mesh
  name="greedy, no cache, $np ranks"; run $np "$exe" "${GREEDY[@]}" --no-cache; expect 0
  cmp -s "$T/out" "$T/greedy1" || fail "greedy: --no-cache gives $(cat "$T/out") on $np ranks, the cache $(cat "$T/greedy1")"
  name="sampled, no cache, $np ranks"; run $np "$exe" "${SAMPLE[@]}" --seed 7 --no-cache; expect 0
  cmp -s "$T/out" "$T/s1" || fail "sampled: --no-cache draws other tokens on $np ranks"
done
PROMPTS=("5,9,2" "7" "1,2,3,4,5,6,7")
name="prompts in one batch"; run 8 "$T/mesh" generate --prompt-ids "$(IFS=';'; echo "${PROMPTS[*]}")" --tokens 8 --temperature 0 -q
expect 0
cp "$T/out" "$T/batch"
for i in 0 1 2; do
  name="prompt $i alone"; run 1 "$T/one" generate --prompt-ids "${PROMPTS[$i]}" --tokens 8 --temperature 0 -q --no-cache
  expect 0
  [ "$(sed -n "$((i + 1))p" "$T/batch")" = "$(cat "$T/out")" ] ||
    fail "prompt ${PROMPTS[$i]}: in a batch $(sed -n "$((i + 1))p" "$T/batch"), alone $(cat "$T/out")"
done
PAST=(generate --prompt-ids "5,9,2;7;1,2,3,4,5,6,7,8,9,10,11,12,13,14" --tokens 30 --temperature 0.8 --top-k 8)
for np in 1 8; do
  exe=$T/one && [ $np = 8 ] && exe=$T/mesh
  name="past the window, $np ranks"; run $np "$exe" "${PAST[@]}"
  expect 0 "past the window of 16 positions, the whole window each token"
  head -3 "$T/out" >"$T/past"
  name="past the window, no cache, $np ranks"; run $np "$exe" "${PAST[@]}" --no-cache -q; expect 0
  cmp -s "$T/out" "$T/past" || fail "past the window on $np ranks: the cache, then the window, draws $(cat "$T/past"); --no-cache $(cat "$T/out")"
done
name="--samples and several prompts"; run 1 "$T/one" generate --prompt-ids "1;2;3" --samples 2
expect 2 "--samples 2 but --prompt-ids gives 3 prompts"
# Attention without a causal mask: no decode step (kdcc warns why), and
# generate reruns the window.
python3 -c "import sys, zipfile; sys.stdout.write(zipfile.ZipFile('models/gpt.keras').read('config.json')
  .decode().replace('\"use_causal_mask\": true', '\"use_causal_mask\": false'))" >"$T/bidi.json"
./kdcc "$T/bidi.json" --batch-size 8 -o "$T/bidi" 2>"$T/out"; rc=$?
name="no causal mask"; expect 0 "no decode step for \`generate\` (it re-runs the whole window for each token): layer 'b0_attn': attention without a causal mask"
[ -f "$T/bidi.kdcc.d/decode.c" ] && fail "a decode step for attention without a causal mask"
name="no causal mask, generate"; run 1 "$T/bidi" generate --prompt-ids 5,9,2 --tokens 3 --init random
expect 0
grep -q "the decode step" "$T/out" && fail "generate used a decode step the model does not have"

# Text: the vocabulary is the distinct bytes of a file.
printf 'the quick brown fox jumps over the lazy dog.\n' >"$T/vocab.txt"
name="text"; run 1 "$T/one" generate --vocab "$T/vocab.txt" --prompt "the fox" --tokens 20 -q
expect 0
python3 - "$T/out" "$T/vocab.txt" <<'PY' || fail "text output: $(cat "$T/out")"
import sys
out = open(sys.argv[1], "rb").read()[:-1]  # the final newline
vocab = set(open(sys.argv[2], "rb").read())
assert out.startswith(b"the fox") and len(out) == 7 + 20 and set(out) <= vocab, out
PY

# Bad requests.
name="a character not in the vocabulary"
run 1 "$T/one" generate --vocab "$T/vocab.txt" --prompt "the CAT"; expect 2 "character 5 (byte 0x43, 'C') is not in --vocab"
name="text without a vocabulary"; run 1 "$T/one" generate --prompt "hi"; expect 2 "needs --vocab FILE"
name="an id out of range"; run 1 "$T/one" generate --prompt-ids 3,64; expect 2 "id 2 is not an integer in [0, 64)"
name="more samples than the batch"; run 1 "$T/one" generate --prompt-ids 3 --samples 9; expect 2 "more than the compiled batch (8)"
name="a bad temperature"; run 1 "$T/one" generate --prompt-ids 3 --temperature -1; expect 2 "--temperature wants a number >= 0"
./kdcc models/seed_mlp.json -w -o "$T/mlp" || exit 1
name="not a language model"; run 1 "$T/mlp" generate --prompt-ids 3; expect 1 "not one sequence of token ids"

finish
