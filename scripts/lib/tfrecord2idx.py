#!/usr/bin/env python3
"""A stand-in for NVIDIA DALI's `tfrecord2idx TFRECORD INDEX`, which DLIO's TFRecord data
generator runs after each file (only DALI's readers use the index). bench/scripts/dlio.sh puts
it on PATH inside the DLIO virtual environment, so DALI itself need not be installed.

The index is DALI's: one line per record, "OFFSET SIZE", SIZE counting the record's whole
framing: an 8-byte little-endian length, a 4-byte CRC of it, the data, a 4-byte CRC of the data.
"""
import struct
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print("usage: tfrecord2idx TFRECORD INDEX", file=sys.stderr)
        return 2
    src, dst = sys.argv[1], sys.argv[2]
    lines = []
    with open(src, "rb") as f:
        f.seek(0, 2)
        end = f.tell()
        offset = 0
        while offset < end:
            f.seek(offset)
            head = f.read(8)
            if len(head) != 8:
                print(f"tfrecord2idx: {src}: a truncated record at {offset}", file=sys.stderr)
                return 1
            (length,) = struct.unpack("<Q", head)
            size = 8 + 4 + length + 4
            if offset + size > end:
                print(f"tfrecord2idx: {src}: a truncated record at {offset}", file=sys.stderr)
                return 1
            lines.append(f"{offset} {size}\n")
            offset += size
    with open(dst, "w") as out:
        out.writelines(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
