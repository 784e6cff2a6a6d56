#!/usr/bin/env bash
# cuda_graph.sh: what lets a CUDA program's training step be captured once
# as a CUDA graph and replayed (issue 22), checked without a GPU on the
# generated program.cu of every model in models/ and examples/ (kdcc
# --target cuda -S), a mixed_float16 one (loss-scaled), the GPT at bf16
# (its attention fused) and the seed MLP under each optimizer, and on the
# runtime's sources:
#  1. each train_step runs its parts inside `if (!kdrt_cuda_replay(d,
#     KDRT_CUDA_TRAIN))`, the setjmp a failed capture returns to first;
#  2. inside the parts, the host values read are those fixed for a graph's
#     rows (c->rows, c->local_rows, c->ragged, c->coord, c->params' address)
#     or those the kernels read from the device in a graph (c->lr, c->step:
#     kdrt_step_scalars), and c->lr and c->step reach only calls whose
#     runtime function hands its kernel kdrt_step_sc(d); no host wait
#     (kdrt_cuda_download, kdrt_cuda_sync), no branch on a host value;
#     except in a loss-scaled program (its decision waits on the host:
#     c->apply_update, c->loss_scale), which kdrt_cuda_replay never captures;
#  3. in runtime/cuda/*.cu, every function that reads the step or the
#     learning rate from the context passes kdrt_step_sc(d), Nadam's marks
#     its graph unsafe, and the functions that wait on the host are the
#     known ones (growing scratch, host-staged collectives, the loss
#     scale's decision, copies to the host), none of which a captured step
#     reaches: a new wait is a failure here until it is looked at.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/lib.sh
begin cuda_graph.sh

n=0
for m in models/*.json examples/*/*.json; do
  case $m in *.dist.json | *keras_layouts.json) continue ;; esac
  case $(head -c 200 "$m") in *'"class_name"'* | *'"module"'*) ;; *) continue ;; esac
  out="$T/$(echo "${m%.json}" | tr / _)"
  if ./kdcc "$m" --target cuda -w -S "$out" >"$T/err" 2>&1; then n=$((n + 1))
  else echo "cuda_graph.sh: note: $m: $(head -1 "$T/err")" >&2; fi
done
./kdcc models/seed_mlp.json --target cuda --dtype-policy mixed_float16 -w -S "$T/loss_scaled" || exit 1
# issue 22: the GPT at bf16, its attention fused (kdrt_cuda_attention, _attention_grad)
./kdcc models/gpt.json --target cuda --precision bf16 --attention fused -w -S "$T/gpt_bf16" || exit 1
grep -q "kdrt_cuda_attention_grad(d," "$T/gpt_bf16/program.cu" || fail "gpt at bf16: attention not fused"
# the seed MLP under each optimizer (Keras's defaults but the rate)
for opt in SGD RMSprop Adagrad Adamax Lion AdamW Nadam; do
  python3 - "$opt" "$T/opt_$opt.json" <<'PY' || fail "no optimizer in models/seed_mlp.json to replace"
import json, sys
m = json.load(open("models/seed_mlp.json"))
o = m["compile_config"]["optimizer"]
o["class_name"], o["config"] = sys.argv[1], {"name": sys.argv[1].lower(), "learning_rate": 0.01}
json.dump(m, open(sys.argv[2], "w"))
PY
  ./kdcc "$T/opt_$opt.json" --target cuda -w -S "$T/opt_$opt" || exit 1
done
[ "$n" -ge 10 ] || fail "only $n models generated"

python3 - "$T" runtime/cuda <<'PY' || fail "the checks above"
import glob, os, re, sys
T, rt = sys.argv[1], sys.argv[2]
bad = []

# ---- the runtime's sources: each kdrt_cuda_* function's body
def functions(path):
    src = open(path).read()
    out = {}
    for m in re.finditer(r'^(?:extern "C" )?(?:static )?[\w\s\*]+?\b(\w+)\(([^;{]*?)\)\s*\{', src, re.M):
        i, depth = m.end(), 1
        while depth and i < len(src):
            depth += {'{': 1, '}': -1}.get(src[i], 0)
            i += 1
        out[m.group(1)] = src[m.end():i]
    return out
# the step protocol itself (the floor, the driver, main) and the op checks
protocol = ('device.cu', 'session.cu', 'main.cu', 'opcheck.cu')
fns = {}
for f in sorted(glob.glob(rt + "/*.cu")):
    for name, body in functions(f).items():
        fns[name] = (os.path.basename(f), body)
def reaches(name, what, seen=()):
    """name's body, or a static helper it calls in the same file, contains what"""
    if name not in fns or name in seen: return False
    f, body = fns[name]
    if what in body: return True
    return any(reaches(h, what, seen + (name,)) for h in re.findall(r'\b(\w+)\(', body)
               if h in fns and fns[h][0] == f and not h.startswith('kdrt_'))
graph_aware = {n for n in fns if n.startswith('kdrt_cuda_') and
               (reaches(n, 'kdrt_step_sc(d)') or reaches(n, 'kdrt_step_neg_lr(d'))}
for must in ('kdrt_cuda_adam', 'kdrt_cuda_sgd', 'kdrt_cuda_dropout', 'kdrt_cuda_weight_decay',
             'kdrt_cuda_matmul'):
    if must not in graph_aware: bad.append("runtime: %s does not hand its kernel kdrt_step_sc(d)" % must)
# functions reading the step or the rate from the context pass the device's
for name, (f, body) in fns.items():
    if f in protocol or not name.startswith('kdrt_cuda_'): continue
    if re.search(r'\bc->(step|lr)\b', body) and name not in graph_aware:
        bad.append("runtime: %s (%s) reads c->step or c->lr but does not pass kdrt_step_sc(d)" % (name, f))
if not reaches('kdrt_cuda_nadam', 'kdrt_cuda_graph_unsafe(d)'):
    bad.append("runtime: kdrt_cuda_nadam no longer marks its graph unsafe")
# host waits: the known ones only
waits = re.compile(r'kdrt_cuda_wait(_event)?\(|wait_for\(|cudaStreamSynchronize|cudaDeviceSynchronize|'
                   r'cudaEventSynchronize|cudaMemcpy\(')
known = {'kdrt_cuda_dscratch', 'kdrt_cuda_hscratch', 'stage_back', 'kdrt_cuda_loss_scale_step',
         'kdrt_cuda_download', 'kdrt_cuda_sync', 'kdrt_cuda_alloc', 'kdrt_cuda_launched',
         'kdrt_cuda_comm_setup', 'kdrt_cuda_comm_free',
         'set_of',  # resident.cu: a data set's one upload, from the fit loop between steps
         'to_compute'}  # waits with KDRT_CUDA_SYNC=1 only, which turns graphs off
for name, (f, body) in fns.items():
    if f in protocol: continue
    if waits.search(body) and name not in known:
        bad.append("runtime: %s (%s) waits on the host: a captured step may not reach it" % (name, f))

# ---- the generated programs
allowed = {'rows', 'local_rows', 'ragged', 'coord', 'lr', 'step', 'params'}
def body_of(src, name):
    m = re.search(r'^static void %s\(kdrt_ctx \*c, kdrt_cuda \*d, int step\) \{\n(.*?)^\}' % name, src,
                  re.M | re.S)
    return m.group(1) if m else None
progs = sorted(glob.glob(T + "/*/program.cu"))
for path in progs:
    src = open(path).read()
    who = os.path.basename(os.path.dirname(path))
    scaled = re.search(r'^  p\.loss_scale = [1-9]', src, re.M) is not None
    m = re.search(r'static void train_step\(.*?\n(.*?)^\}', src, re.M | re.S)
    if not m:
        bad.append("%s: no train_step" % who); continue
    step = m.group(1)
    g = re.search(r'  if \(!kdrt_cuda_replay\(d, KDRT_CUDA_TRAIN\)\) \{[^\n]*\n(.*?)\n  \}\n'
                  r'  kdrt_cuda_end\(d, KDRT_CUDA_TRAIN, d->logs, logs\);', step, re.S)
    if not g:
        bad.append("%s: train_step's parts are not inside kdrt_cuda_replay's branch" % who); continue
    inner = g.group(1)
    lines = [l for l in inner.split('\n') if l.strip() and not l.strip().startswith('//')]
    if not lines or lines[0].strip() != '(void)setjmp(*kdrt_cuda_capture_env(d));':
        bad.append("%s: the capture's setjmp is not the first statement of the parts" % who)
    parts = re.findall(r'^    (\w+)\(c, d, TRAIN_STEP\);', inner, re.M)
    if not parts: bad.append("%s: no parts in train_step" % who)
    for p in parts:
        body = body_of(src, p)
        if body is None:
            bad.append("%s: no body for part %s" % (who, p)); continue
        code = '\n'.join(re.sub(r'//.*', '', l) for l in body.split('\n'))
        scaled_only = ('apply_update', 'loss_scale', 'iterations')
        for f in set(re.findall(r'\bc->(\w+)', code)):
            if f not in allowed and not (scaled and f in scaled_only):
                bad.append("%s: %s reads c->%s, which a graph would freeze" % (who, p, f))
        for line in code.split('\n'):
            if re.search(r'\bc->(lr|step)\b', line):
                call = re.search(r'\b(kdrt_cuda_\w+)\(d,', line)
                if not call or call.group(1) not in graph_aware | {'kdrt_cuda_nadam'}:
                    bad.append("%s: %s passes c->lr or c->step to %s, which reads no device scalar"
                               % (who, p, call.group(1) if call else line.strip()[:60]))
            if re.search(r'\bkdrt_cuda_(download|sync)\(', line):
                bad.append("%s: %s waits on the host inside the captured step" % (who, p))
            if re.search(r'\bkdrt_cuda_loss_scale_step\(', line) and not scaled:
                bad.append("%s: %s decides a loss scale, but the program has none" % (who, p))
            for cond in re.findall(r'\b(?:if|while|for)\s*\(([^{]*)\)\s*\{', line):
                for f in re.findall(r'\bc->(\w+)', cond):
                    if not (scaled and f == 'apply_update') and f not in ('rows', 'ragged', 'coord'):
                        bad.append("%s: %s branches on c->%s inside the captured step" % (who, p, f))
    if who == 'loss_scaled' and not scaled:
        bad.append("loss_scaled: its program table does not say loss_scale (kdrt_cuda_replay "
                   "would capture a step that waits on the host)")
    if who.startswith('opt_') and 'kdrt_cuda_%s(d,' % who[4:].lower() not in src:
        bad.append("%s: the program does not call kdrt_cuda_%s" % (who, who[4:].lower()))
for b in bad: print("cuda_graph.sh:", b, file=sys.stderr)
print("cuda_graph.sh: %d programs, %d graph-aware runtime functions checked" % (len(progs), len(graph_aware)))
sys.exit(1 if bad else 0)
PY
finish
