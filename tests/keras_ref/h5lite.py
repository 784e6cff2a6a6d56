"""Read the datasets of a small HDF5 file with the Python standard library.

Enough of the format (https://docs.hdfgroup.org/hdf5/develop/_f_m_t3.html)
for the weights files Keras and kdcc write, so that `make test` can compare
weights without h5py or numpy:

  superblock versions 0-3; object headers version 1 and 2 (with
  continuation blocks); groups as symbol tables (v1 B-tree + local heap) or
  compact link messages; datasets with a simple dataspace, a little-endian
  IEEE float or integer type, and a contiguous or compact layout.

Anything else (dense link storage in a fractal heap, chunked or filtered
data, big-endian types, external files) raises H5Error naming what it met.

    datasets(path) -> {"layers/dense/vars/0": (shape tuple, flat list), ...}
"""

import struct

SIGNATURE = b"\x89HDF\r\n\x1a\n"
UNDEF = 0xFFFFFFFFFFFFFFFF


class H5Error(Exception):
    pass


class _File:
    def __init__(self, data):
        self.d = data
        base = None
        for off in [0] + [512 << i for i in range(20)]:
            if off + 8 <= len(data) and data[off:off + 8] == SIGNATURE:
                base = off
                break
        if base is None:
            raise H5Error("not an HDF5 file (no signature)")
        v = data[base + 8]
        if v in (0, 1):
            self.so, self.sl = data[base + 13], data[base + 14]
            p = base + 24 + (4 if v == 1 else 0)
            self.base = self.uint(p, self.so)
            p += 4 * self.so  # base, free space, end of file, driver info
            # root group symbol table entry: link name offset, object header
            self.root = self.uint(p + self.so, self.so)
        elif v in (2, 3):
            self.so, self.sl = data[base + 9], data[base + 10]
            p = base + 12
            self.base = self.uint(p, self.so)
            self.root = self.uint(p + 3 * self.so, self.so)
        else:
            raise H5Error(f"superblock version {v}")

    def uint(self, p, n):
        return int.from_bytes(self.d[p:p + n], "little")

    def addr(self, a):
        return self.base + a

    # ---- object headers: a list of (type, data bytes)
    def messages(self, a):
        p = self.addr(a)
        d = self.d
        out = []
        if d[p:p + 4] == b"OHDR":
            flags = d[p + 5]
            q = p + 6
            if flags & 0x20:
                q += 16
            if flags & 0x10:
                q += 4
            n = 1 << (flags & 3)
            size = self.uint(q, n)
            q += n
            self._v2_block(q, q + size, flags, out)
        elif d[p] == 1:
            nmsg = self.uint(p + 2, 2)
            size = self.uint(p + 8, 4)
            blocks = [(p + 16, p + 16 + size)]
            while blocks and len(out) < nmsg:
                q, end = blocks.pop(0)
                while q + 8 <= end and len(out) < nmsg:
                    t, sz = self.uint(q, 2), self.uint(q + 2, 2)
                    body = d[q + 8:q + 8 + sz]
                    if t == 0x10:  # continuation
                        ca = self.addr(self.uint(q + 8, self.so))
                        blocks.append((ca, ca + self.uint(q + 8 + self.so, self.sl)))
                    out.append((t, body))
                    q += 8 + sz
        else:
            raise H5Error(f"object header at {a}: unknown version")
        return out

    def _v2_block(self, q, end, flags, out):
        d = self.d
        while q + 4 <= end - 4:  # the block ends in a checksum
            t, sz, mflags = d[q], self.uint(q + 1, 2), d[q + 3]
            q += 4 + (2 if flags & 0x04 else 0)
            body = d[q:q + sz]
            if t == 0x10:
                ca = self.addr(self.uint(q, self.so))
                cl = self.uint(q + self.so, self.sl)
                if d[ca:ca + 4] != b"OCHK":
                    raise H5Error("bad continuation block")
                self._v2_block(ca + 4, ca + cl, flags, out)
            out.append((t, body))
            q += sz

    # ---- groups: {name: object header address}
    def links(self, a):
        out = {}
        for t, b in self.messages(a):
            if t == 0x11:  # symbol table: v1 B-tree + local heap
                bt, heap = self.uint_b(b, 0), self.uint_b(b, self.so)
                self._btree(bt, self._heap(heap), out)
            elif t == 0x06:  # link message
                flags = b[1]
                q = 2
                ltype = 0
                if flags & 0x08:
                    ltype = b[q]
                    q += 1
                if flags & 0x04:
                    q += 8
                if flags & 0x10:
                    q += 1
                n = 1 << (flags & 3)
                ln = int.from_bytes(b[q:q + n], "little")
                q += n
                name = b[q:q + ln].decode()
                q += ln
                if ltype == 0:
                    out[name] = int.from_bytes(b[q:q + self.so], "little")
            elif t == 0x02:  # link info
                fheap = int.from_bytes(b[2 + (8 if b[1] & 1 else 0):][:self.so], "little")
                if fheap != UNDEF >> (64 - 8 * self.so):
                    raise H5Error("group links in dense storage (fractal heap)")
        return out

    def uint_b(self, b, p):
        return int.from_bytes(b[p:p + self.so], "little")

    def _heap(self, a):
        p = self.addr(a)
        if self.d[p:p + 4] != b"HEAP":
            raise H5Error("bad local heap")
        return self.addr(self.uint(p + 8 + 2 * self.sl, self.so))

    def _name(self, heap_data, off):
        q = heap_data + off
        return self.d[q:self.d.index(b"\0", q)].decode()

    def _btree(self, a, heap_data, out):
        p = self.addr(a)
        d = self.d
        if d[p:p + 4] != b"TREE" or d[p + 4] != 0:
            raise H5Error("bad group B-tree node")
        level, used = d[p + 5], self.uint(p + 6, 2)
        q = p + 8 + 2 * self.so + self.sl  # past the siblings and key 0
        for _ in range(used):
            child = self.uint(q, self.so)
            q += self.so + self.sl
            if level:
                self._btree(child, heap_data, out)
                continue
            s = self.addr(child)
            if d[s:s + 4] != b"SNOD":
                raise H5Error("bad symbol table node")
            e = s + 8
            for _ in range(self.uint(s + 6, 2)):
                name = self._name(heap_data, self.uint(e, self.so))
                out[name] = self.uint(e + self.so, self.so)
                e += 2 * self.so + 24

    # ---- datasets: (shape, values) or None for a group
    def dataset(self, a):
        msgs = dict()
        for t, b in self.messages(a):
            msgs.setdefault(t, b)
        if 0x08 not in msgs:
            return None
        if 0x0B in msgs:
            raise H5Error("filtered (compressed) dataset")
        shape = self._space(msgs[0x01])
        fmt = self._type(msgs[0x03])
        bf16 = fmt == "bf16"
        fmt = "H" if bf16 else fmt
        count = 1
        for s in shape:
            count *= s
        raw = self._layout(msgs[0x08], count * struct.calcsize(fmt))
        vals = list(struct.unpack("<%d%s" % (count, fmt), raw))
        if bf16:  # a float32's upper half
            vals = list(struct.unpack("<%df" % count,
                                      struct.pack("<%dI" % count, *[u << 16 for u in vals])))
        return tuple(shape), vals

    def _space(self, b):
        v, nd, flags = b[0], b[1], b[2]
        q = 8 if v == 1 else 4
        if v == 2 and b[3] == 0:
            return []  # scalar
        return [int.from_bytes(b[q + i * self.sl:q + (i + 1) * self.sl], "little")
                for i in range(nd)]

    def _type(self, b):
        cls, bits, size = b[0] & 0x0F, b[1], int.from_bytes(b[4:8], "little")
        if bits & 1:
            raise H5Error("big-endian data")
        if cls == 1:
            return {4: "f", 8: "d", 2: "e"}[size]
        if cls == 0:
            signed = bits & 0x08
            return {1: "b", 2: "h", 4: "i", 8: "q"}[size] if signed else \
                {1: "B", 2: "H", 4: "I", 8: "Q"}[size]
        if cls == 5 and size == 2:  # opaque: Keras's bfloat16 (issue 23)
            return "bf16"
        raise H5Error(f"datatype class {cls}")

    def _layout(self, b, nbytes):
        v = b[0]
        if v in (3, 4):
            cls = b[1]
            if cls == 0:
                n = int.from_bytes(b[2:4], "little")
                return bytes(b[4:4 + n])[:nbytes]
            if cls == 1:
                a = self.uint_b(b, 2)
                if a == UNDEF >> (64 - 8 * self.so):
                    return b"\0" * nbytes  # never written: fill value 0
                p = self.addr(a)
                return bytes(self.d[p:p + nbytes])
            raise H5Error("chunked dataset" if cls == 2 else f"layout class {cls}")
        if v in (1, 2):
            nd, cls = b[1], b[2]
            if cls == 1:
                p = self.addr(self.uint_b(b, 8))
                return bytes(self.d[p:p + nbytes])
            if cls == 0:
                q = 8 + 4 * nd
                n = int.from_bytes(b[q:q + 4], "little")
                return bytes(b[q + 4:q + 4 + n])[:nbytes]
            raise H5Error(f"layout class {cls}")
        raise H5Error(f"layout message version {v}")


def datasets(path):
    """{path: (shape, flat values)} for every dataset in the file."""
    with open(path, "rb") as f:
        h = _File(memoryview(f.read()).tobytes())
    out = {}

    def walk(prefix, a, seen):
        if a in seen:
            return
        seen.add(a)
        ds = h.dataset(a)
        if ds is not None:
            out[prefix] = ds
            return
        for name, child in sorted(h.links(a).items()):
            walk(f"{prefix}/{name}" if prefix else name, child, seen)

    walk("", h.root, set())
    return out
