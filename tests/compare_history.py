#!/usr/bin/env python3
"""Compare kdcc --history files: every number equal within a relative tolerance.

usage: compare_history.py RTOL REFERENCE OTHER...
Exit status 1 (with the first difference printed) when any file differs."""
import json
import sys


def flatten(prefix, v, out):
    if isinstance(v, dict):
        for k in sorted(v):
            flatten(f"{prefix}.{k}", v[k], out)
    elif isinstance(v, list):
        for i, x in enumerate(v):
            flatten(f"{prefix}[{i}]", x, out)
    else:
        out[prefix] = v


def main():
    rtol = float(sys.argv[1])
    ref = {}
    flatten("", json.load(open(sys.argv[2])), ref)
    if not ref:
        print(f"{sys.argv[2]}: empty history")
        return 1
    bad = 0
    for path in sys.argv[3:]:
        got = {}
        flatten("", json.load(open(path)), got)
        if set(got) != set(ref):
            print(f"{path}: keys differ from {sys.argv[2]}: {sorted(set(got) ^ set(ref))}")
            bad = 1
            continue
        worst = max(abs(got[k] - ref[k]) / max(abs(ref[k]), 1e-12) for k in ref)
        status = "ok" if worst <= rtol else "DIFFERS"
        print(f"  {path}: worst relative difference {worst:.2e} ({status})")
        if worst > rtol:
            for k in ref:
                if abs(got[k] - ref[k]) > rtol * max(abs(ref[k]), 1e-12):
                    print(f"    {k}: {got[k]!r} vs {ref[k]!r}")
                    break
            bad = 1
    return bad


if __name__ == "__main__":
    sys.exit(main())
