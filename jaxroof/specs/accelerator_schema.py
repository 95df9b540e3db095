"""The schema of an accelerator entry: the shipped table's and a user's file.

Every field `accelerators.entry_to_accelerator` and its `_links` read, with
what it may hold: datasheet figures finite and > 0 within `LIMITS` (about
100x today's largest parts, so a typo in units is refused rather than swept),
link figures likewise (a zero or negative bandwidth, a NaN latency: refused),
the texts a message or a test of a string reads, and the objects `dict(...)`
copies. Fields no code reads (sources, quotes, notes) may hold anything.

A user's accelerator file is one entry, or `{"accelerators":
{slug: entry}}` with one slug (`FILE`); `KIND` bounds its size and nesting.
"""

from __future__ import annotations

from jaxroof import schema
from jaxroof.schema import Anything, ListOf, MapOf, Object, OneOf, Positive, Text, Whole

# The dense rates an entry may give, in TFLOP/s (int8: TOP/s); null (or absent)
# means no such datapath (weights in that format run at the bf16 rate).
RATE_DTYPES = ("bf16", "fp16", "fp8", "int8", "mxfp4", "nvfp4", "fp32")
LIMITS = {
    "memory_capacity_gb": 1e5, "memory_bandwidth_tb_s": 1e3, "dense_tflops": 1e6, "tdp_w": 1e5,
    "link_gb_s": 1e5, "latency_us": 1e6, "chips": 10**6
}
MAX_FILE_BYTES = 1 << 20
MAX_FILE_DEPTH = 12

_LINK = Positive(LIMITS["link_gb_s"], null=True, unit="GB/s")
_LATENCY = Positive(LIMITS["latency_us"], null=True, unit="us")
_CHIPS = Whole(1, LIMITS["chips"], null=True)
_TEXT = Text(max_len=1000, null=True, empty=True)
# NCCL's per-protocol latencies (tuning.cc): LL is the one read.
_PROTOCOLS = Object({"LL": Positive(LIMITS["latency_us"], unit="us")}, required=("LL",),
                    extra=_LATENCY, null=True)

SCALE_UP = Object(
    {
        "technology": _TEXT,
        "generation": _TEXT,
        "topology": _TEXT,
        "links_per_chip": _CHIPS,
        "unidirectional_gb_s": Positive(LIMITS["link_gb_s"], unit="GB/s"),
        "per_link_unidirectional_gb_s": _LINK,
        "bidirectional_gb_s": _LINK,
        "peer_to_peer_unidirectional_gb_s": _LINK,
    }, required=("unidirectional_gb_s",), null=True)

SCALE_UP_DOMAIN = Object(
    {
        "chips": _CHIPS,
        "max_single_slice_chips": _CHIPS,
        "unit": _TEXT,
        "slice_shapes": OneOf((ListOf(Text(max_len=64), max_len=10_000), Text(), MapOf(
            Anything()), schema.Number(null=True)), "a list of shapes such as \"2x4\" (or a note)"),
    }, null=True)

HOP_LATENCY = Object(
    {
        "value_us": _LATENCY,
        "kind": _TEXT,
        "modeling_assumptions": Object(
            {
                "nccl_ring_per_step_us": _PROTOCOLS,
                "nccl_pci_ring_per_step_us": _PROTOCOLS,
                "nccl_ring_base_us": _PROTOCOLS,
            }, null=True),
    }, null=True)

SCALE_OUT = Object({"per_chip_unidirectional_gb_s": _LINK}, null=True)

ENTRY = Object(
    {
        "name": Text(max_len=200),
        "vendor": Text(max_len=200),
        "memory_type": Text(max_len=200, empty=True),
        "memory_capacity_gb": Positive(LIMITS["memory_capacity_gb"], unit="GB"),
        "memory_bandwidth_tb_s": Positive(LIMITS["memory_bandwidth_tb_s"], unit="TB/s"),
        "dense_tflops": Object(
            {
                dtype: Positive(LIMITS["dense_tflops"], null=dtype != "bf16", unit="TFLOP/s")
                for dtype in RATE_DTYPES
            }, required=("bf16",), extra=None),
        "tdp_w": Positive(LIMITS["tdp_w"], null=True, unit="W"),
        "on_chip": MapOf(Anything()),
        "interconnect": Object(
            {"type": _TEXT, "unidirectional_gb_s": _LINK, "bidirectional_gb_s": _LINK}),
        "sources": MapOf(Anything()),
        "decisions": ListOf(Text(max_len=10_000, empty=True), max_len=1000),
        "scale_up": SCALE_UP,
        "scale_up_domain": SCALE_UP_DOMAIN,
        "hop_latency": HOP_LATENCY,
        "scale_out": SCALE_OUT,
    }, required=("name", "memory_capacity_gb", "memory_bandwidth_tb_s", "dense_tflops"))

# The shipped table: every entry complete.
TABLE = Object(
    {
        "accelerators": MapOf(
            Object(
                ENTRY.fields, required=ENTRY.required +
                ("vendor", "memory_type", "on_chip", "interconnect", "tdp_w", "sources",
                 "decisions"))),
    }, required=("accelerators",))

# A user's file: one entry, or a table of exactly one.
FILE = schema.Switch(lambda data: Object(
    {"accelerators": MapOf(ENTRY, min_len=1, max_len=1)}, required=("accelerators",)) if isinstance(
        data, dict) and "accelerators" in data else ENTRY)
KIND = schema.FileKind(what="accelerator file", schema=FILE, max_bytes=MAX_FILE_BYTES,
                       max_depth=MAX_FILE_DEPTH)
