#!/usr/bin/env bash
# layering.sh (issue 25): the files of compiler/ and of runtime/ (with
# runtime/cuda/) call each other only one way: the file-level call graph,
# from the definitions and calls in the sources, has no circle. A circle
# fails the test, named file by file with the functions each calls in the
# next. compiler/ops.c and ops_nn.c are one stage (they share ops_impl.h).
# The CUDA runtime is in floors: device.cu (kdrt_cuda_fail, waits, copies,
# scratch, graphs) beneath the kernels, comm.cu, resident.cu and cudnn.cu;
# session.cu (the device opened, the steps, shutdown) above them; opcheck.cu
# and main.cu on top. What device.cu must reach above it (the
# communicators' abort and poll) comes down as function pointers that
# session.cu sets, which a text reading rightly does not count as calls.
#
# Text, not a C parser: comments, strings (emitted code: "main(") and
# character literals are dropped; a definition is a non-static function
# or object at the start of a line; a use is a call (name followed by "(")
# or any mention of an object. A file's own static functions and macros
# shadow another file's names; a name defined in several files is skipped.
# Tables made by macros (ops_nn.c's op_defs, from runtime/kdrt_ops.def) are not seen:
# they register ops and call none.
set -uo pipefail
cd "$(dirname "$0")/../.."

# check [--same A,B] FILE...: status 1 and the circles when there are any.
check() {
  python3 - "$@" <<'PY'
import os, re, sys
from collections import defaultdict

same, args = {}, sys.argv[1:]
while args and args[0] == '--same':
    a, b = args[1].split(',')
    same[os.path.normpath(b)] = os.path.normpath(a)
    args = args[2:]

def unit(f):
    f = os.path.normpath(f)
    return same.get(f, f)

def code(path):  # comments, strings and character literals out
    s = open(path, encoding='utf-8', errors='replace').read()
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])\'',
                  lambda m: '""' if m.group(0).startswith('"') else ' ', s, flags=re.S)

KEYWORDS = {'if', 'for', 'while', 'switch', 'return', 'sizeof', 'else', 'do', 'case'}
FUNC = re.compile(r'^(?!static\b|typedef\b|#)(?:extern\s*""\s*)?[A-Za-z_][\w \*]*?\b(\w+)\s*'
                  r'\(([^;{)]*(?:\([^)]*\)[^;{)]*)*)\)\s*\{', re.M)
OBJ = re.compile(r'^(?!static\b|typedef\b|extern\b|return\b|#)(?:const\s+)?\w+(?:\s*\*)*\s*'
                 r'(?:const\s+)?\**\s*(\w+)\s*(?:\[[^\]\n]*\])*\s*=', re.M)
STATIC = re.compile(r'^static\b[^;={(]*?\b(\w+)\s*\(', re.M)
MACRO = re.compile(r'^\s*#\s*define\s+(\w+)', re.M)

defs = defaultdict(set)  # name -> the units that define it
objs = set()             # the names of objects: any mention uses them
own = defaultdict(set)   # unit -> its statics and macros
src = defaultdict(list)
for f in args:
    u, s = unit(f), code(f)
    src[u].append(s)
    for m in FUNC.finditer(s):
        if m.group(1) not in KEYWORDS: defs[m.group(1)].add(u)
    for m in OBJ.finditer(s):
        defs[m.group(1)].add(u)
        objs.add(m.group(1))
    own[u].update(m.group(1) for m in STATIC.finditer(s))
    own[u].update(m.group(1) for m in MACRO.finditer(s))

edges = defaultdict(dict)  # unit -> unit -> the names it uses there
for u, texts in src.items():
    used = set()
    for s in texts:
        used.update(re.findall(r'\b([A-Za-z_]\w*)\s*\(', s))
        used.update(w for w in re.findall(r'\b([A-Za-z_]\w*)\b', s) if w in objs)
    for w in used:
        d = defs.get(w)
        if not d or len(d) != 1 or u in d or w in own[u]: continue
        edges[u].setdefault(next(iter(d)), set()).add(w)

# the strongly connected components (Tarjan's), then one circle in each
index, low, stack, on, comps = {}, {}, [], set(), []
def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(edges[v]):
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        c = []
        while not c or c[-1] != v:
            c.append(stack.pop())
            on.discard(c[-1])
        if len(c) > 1: comps.append(sorted(c))
sys.setrecursionlimit(10000)
for v in sorted(src):
    if v not in index: visit(v)

def circle(c):  # the shortest through c's first file (breadth first)
    prev, todo = {}, [c[0]]
    while todo:
        v = todo.pop(0)
        for w in sorted(edges[v]):
            if w in c and w not in prev:
                prev[w] = v
                todo.append(w)
    p = [c[0]]
    while p[-1] != c[0] or len(p) == 1: p.append(prev[p[-1]])
    return p[::-1]

for c in comps:
    p = circle(c)
    print('layering: a circle of files: ' + ' -> '.join(p))
    for a, b in zip(p, p[1:]):
        print('  %s -> %s: %s' % (a, b, ', '.join(sorted(edges[a][b]))))
    if len(c) > len(p) - 1:
        print('  (the circle is one of those among %d files: %s)' % (len(c), ' '.join(c)))
sys.exit(1 if comps else 0)
PY
}

fails=0
fail() { echo "layering.sh: FAIL: $*" >&2; fails=$((fails + 1)); }

# The test can fail: a circle of two files and one of three are found and
# named; a call inside a string or a comment, or of a file's own static
# function, is none.
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
printf 'int a(void) { return b(); }\n' >"$T/a.c"
printf 'int b(void) { return a(); }\n' >"$T/b.c"
if check "$T/a.c" "$T/b.c" >"$T/out" ||
   ! grep -qF "a circle of files: $T/a.c -> $T/b.c -> $T/a.c" "$T/out"; then
  fail "a circle of two files not found:"; cat "$T/out" >&2
fi
printf 'int b(void) { return c(); }\n' >"$T/b.c"
printf 'int c(void) { return a(); }\n' >"$T/c.c"
if check "$T/a.c" "$T/b.c" "$T/c.c" >"$T/out" ||
   ! grep -qF "$T/a.c -> $T/b.c -> $T/c.c -> $T/a.c" "$T/out" ||
   ! grep -qF "  $T/c.c -> $T/a.c: a" "$T/out"; then
  fail "a circle of three files not found:"; cat "$T/out" >&2
fi
printf 'static int a(void) { return 0; }\n// a()\nconst char *s = "a()";\n' >"$T/c.c"
printf 'int c(void) { return a(); }\n' >>"$T/c.c"
if ! check "$T/a.c" "$T/b.c" "$T/c.c" >"$T/out"; then
  fail "a circle where there is none:"; cat "$T/out" >&2
fi

check --same compiler/ops.c,compiler/ops_nn.c compiler/*.c || fail "compiler/"
check runtime/*.c runtime/cuda/*.cu || fail "runtime/"
[ "$fails" = 0 ] || exit 1
echo "layering.sh: ok (no circle among compiler/*.c, nor runtime/*.c and runtime/cuda/*.cu)"
