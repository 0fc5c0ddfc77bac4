"""Block hashes for prefix caching: a full block's identity is a hash chained over its
parent block's hash, its token ids and any extra keys (anything besides the tokens that
changes its KV values, such as an adapter id or a cache salt).

The hash is BLAKE2b with a 16-byte (128-bit) digest over a fixed binary encoding, never
Python's ``hash`` (salted per process and 64-bit): two different prefixes collide with
probability ~2^-128, and the same prefix hashes the same in every process and run.
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence

BlockHash = bytes
ROOT: BlockHash = b"\x00" * 16


def hash_block(parent: BlockHash, token_ids: Sequence[int], extra_keys: tuple = ()) -> BlockHash:
    """The hash of one full block, given its parent's (``ROOT`` for the first block)."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(struct.pack(f"<{len(token_ids)}q", *token_ids))
    if extra_keys:
        h.update(repr(extra_keys).encode())
    return h.digest()


def extend_hashes(hashes: list[BlockHash], token_ids: Sequence[int], block_size: int,
                  extra_keys: tuple = ()) -> list[BlockHash]:
    """Append to ``hashes`` the hash of every further full block of ``token_ids``."""
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[i - 1] if i else ROOT
        hashes.append(hash_block(parent, token_ids[i * block_size:(i + 1) * block_size], extra_keys))
    return hashes
