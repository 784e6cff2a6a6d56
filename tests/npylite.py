"""Test data files written with Python's standard library alone (the system
python3 has no numpy): .npy arrays and IDX files, as data.c reads them. The
shell tests' inline scripts import it after sys.path.insert(0, "tests")."""
import gzip
import struct


def save_npy(path, descr, fmt, shape, values):
    """A C-order .npy of dtype descr ('<f4', '<i8', '|u1', ...) and shape,
    values packed with struct's format letter fmt ('f', 'q', 'B', ...); the
    header padded so the data starts at a multiple of 64."""
    h = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, ", ".join(map(str, shape)) + ("," if len(shape) == 1 else ""))
    h += " " * (63 - (10 + len(h)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode())
        f.write(struct.pack("<%d%s" % (len(values), fmt), *values))


def save_idx(path, type_byte, dims, payload, gz=False):
    """An IDX file (MNIST's format): type_byte 0x08 unsigned bytes, 0x0D
    big-endian floats, ...; payload the packed values; gz: gzip'd."""
    data = struct.pack(">BBBB", 0, 0, type_byte, len(dims)) + \
        struct.pack(">%dI" % len(dims), *dims) + payload
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(data)
