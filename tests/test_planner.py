"""The planner is pure: (arch, shape, format, environment, table) -> Plan. Specified case by case here."""
import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mixed_mla import backends, planner
from mixed_mla.constants import KV_FORMATS, SUPPORTED_NUM_HEADS
from mixed_mla.planner import Plan, candidates, heuristic_splits, plan_for, variants


@pytest.fixture(autouse=True)
def no_tables_no_env(monkeypatch):
    """Each test starts from the heuristic with a clean environment; tests that need a table install one."""
    for name in ("MLA_BACKEND", "MLA_KV_FORMAT", "MLA_SPLITS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(planner, "_EMBEDDED_TABLES", {})
    planner.table_for.cache_clear()
    yield
    planner.table_for.cache_clear()


def _install_table(monkeypatch, arch, entries):
    text = json.dumps({"device": arch, "provenance": {"measured_by": "test"}, "entries": entries})
    monkeypatch.setattr(planner, "_EMBEDDED_TABLES", {planner.TABLE_FILES[arch]: text})
    planner.table_for.cache_clear()


MEASURED = {"class": "d", "basis": "tools/autotune.py in a test"}


def _entry(plan, kv_format="auto", batch=4, kv_len=1024, evidence=MEASURED):
    return {"batch": batch, "q_len": 1, "kv_len": kv_len, "num_heads": 16, "kv_format": kv_format, "plan": plan,
            "us": 5.0, "evidence": evidence}


def test_cpu_plans_the_torch_backend_on_bf16():
    assert plan_for("cpu", 4, 1, 1024, 16) == Plan("torch", "bf16", 1)
    assert plan_for("cpu", 4, 1, 1024, 16, "mxfp4") == Plan("torch", "mxfp4", 1)


def test_device_defaults():
    assert plan_for("sm90", 4, 1, 1024, 16) == Plan("cuda_sm90", "fp8", 16)
    # the heuristic's hip_gfx950 plans have no evidence (class (c) is per emulated table entry): aiter's (a)
    assert plan_for("gfx950", 4, 1, 1024, 16) == Plan("aiter", "fp8", 32, "", 1)
    assert plan_for("gfx950", 4, 1, 1024, 16, "mxfp4").backend == "hip_gfx950"
    assert plan_for("gfx950", 4, 1, 1024, 16, "bf16").backend == "aiter"      # the HIP kernels read fp8/mxfp4
    assert plan_for("gfx942", 4, 1, 1024, 16).backend == "aiter"
    assert plan_for("gfx942", 4, 1, 1024, 16, "mxfp4").backend == "torch"     # aiter has no mxfp4 kernel
    assert plan_for("cuda", 4, 1, 1024, 16).backend == "torch"


@pytest.mark.parametrize("arch, batch, q_len, kv_len, heads, splits", [
    # short rows: one CTA per SM, splits down to 64 tokens (H200 best measured in parentheses;
    # benchmarks/results/planner/)
    ("sm90", 1, 1, 4096, 16, 64),      # 4096 / 64 (s32-64 within 2%; the old 16 was 23% slower)
    ("sm90", 4, 1, 1024, 16, 16),      # 1024 / 64 (table: 16)
    ("sm90", 8, 1, 2048, 16, 16),      # 132 // 8 (s16; the old 8 was 18% slower)
    ("sm90", 4, 1, 8192, 16, 33),      # 132 // 4 (table: 32)
    ("sm90", 32, 1, 1024, 16, 4),      # 132 // 32 (table: 4)
    # long rows: unsplit if that keeps >= 75% of the 264 slots (2 CTAs per SM) busy, else the fewest splits
    # of >= 256 tokens keeping >= 90% busy
    ("sm90", 16, 1, 16384, 16, 15),    # 240 of 264 (s16 measured; the old 17 started a second wave: 29% slower)
    ("sm90", 48, 1, 4096, 16, 5),      # 240 of 264 (s5 measured best; the old 6 was 35% slower)
    ("sm90", 40, 1, 16384, 16, 6),     # 240 of 264 (s6 measured best)
    ("sm90", 32, 1, 8192, 16, 8),      # 256 of 264 (table: 8)
    ("sm90", 128, 1, 2048, 16, 2),     # 256 of 264 (s2 measured best)
    ("sm90", 160, 1, 4096, 16, 3),     # 480 of 528: unsplit, 28 SMs hold two CTAs and the rest one
    ("sm90", 96, 1, 1024, 16, 2),      # at most 4 splits, none reaches 90%: 192 of 264 is the closest (s2 best)
    ("sm90", 200, 1, 2048, 16, 1),     # unsplit keeps 200 of 264 busy (s1 measured best; s5 15% slower)
    ("sm90", 256, 1, 8192, 16, 1),     # (table: 1)
    ("sm90", 32, 4, 8192, 16, 2),      # 4 queries per segment are 4 rows each
    ("sm90", 64, 1, 8192, 128, 1),     # 8 head groups x 64 rows: 512 of 528
    ("gfx950", 4, 1, 100000, 16, 64),  # capped at 64
    ("gfx950", 8, 1, 100, 16, 1),      # too short to split
])
def test_heuristic_splits(arch, batch, q_len, kv_len, heads, splits):
    assert heuristic_splits(arch, batch, q_len, kv_len, heads) == splits


def test_the_sm90_plan_drops_splits_that_would_be_empty():
    # 132 // 4 = 33 splits of 8192 tokens round to 256 each: 32 carry them all
    assert heuristic_splits("sm90", 4, 1, 8192, 16) == 33
    assert planner.heuristic_plan("sm90", 4, 1, 8192, 16).num_splits == 32
    # 3 rows: 44 splits round to 192 tokens, of which 43 carry the row (the last one 128 tokens)
    assert planner.heuristic_plan("sm90", 3, 1, 8192, 16).num_splits == 43
    assert planner.heuristic_plan("sm90", 32, 1, 8192, 16).num_splits == 8   # nothing to drop


@given(kv_len=st.integers(0, 200000), splits=st.integers(1, 64), tile=st.sampled_from([32, 64]))
def test_fewest_splits_for_share_keeps_the_share_and_drops_only_empty_splits(kv_len, splits, tile):
    def share(s):
        return -(-(-(-kv_len // s)) // tile) * tile
    fewest = planner.fewest_splits_for_share(kv_len, splits, tile)
    assert 1 <= fewest <= splits and share(fewest) == share(splits)
    assert fewest == 1 or (fewest - 1) * share(fewest) < kv_len  # every split kept has tokens
    assert fewest == 1 or share(fewest - 1) > share(splits)      # and one fewer would lengthen them


def test_an_empty_cache_plans_one_split():
    # the GPU property test found it: kv_len 0 divided by a zero share
    assert planner.fewest_splits_for_share(0, 5, 32) == 1
    assert planner.heuristic_plan("sm90", 3, 1, 0, 16).num_splits == 1


@given(arch=st.sampled_from(["sm90", "gfx950", "gfx942", "cpu"]), batch=st.integers(1, 1024),
       q_len=st.integers(1, 4), kv_len=st.integers(1, 200000), heads=st.sampled_from(SUPPORTED_NUM_HEADS))
def test_heuristic_split_invariants(arch, batch, q_len, kv_len, heads):
    splits = heuristic_splits(arch, batch, q_len, kv_len, heads)
    assert 1 <= splits <= planner.MAX_SPLITS
    assert splits == 1 or kv_len // splits >= 64
    rows = batch * q_len * (heads // 16)
    units = planner._COMPUTE_UNITS.get(arch)
    if units is not None and rows * (kv_len // 256) >= units:   # long rows: no split count fills the slots better
        use = planner.slot_use(rows * splits, 2 * units)
        assert use >= 0.9 or (splits == 1 and use >= 0.75) or all(planner.slot_use(rows * s, 2 * units) <= use
                                 for s in range(1, min(kv_len // 256, 64) + 1))


def test_slot_use():
    assert planner.slot_use(264, 264) == 1.0
    assert planner.slot_use(265, 264) == 265 / 528          # one workgroup more starts a second wave
    assert planner.slot_use(160, 264) == 160 / 264


def test_plans_are_pure():
    """plan_for depends on its arguments alone: what other calls asked for in between carries nothing over (a plan
    remembered per shape but not per format, or a plan changed after it was returned, fails this)."""
    first = plan_for("sm90", 32, 2, 4096, 64, "fp8")
    others = {kv_format: plan_for("sm90", 32, 2, 4096, 64, kv_format) for kv_format in ("mxfp4", "bf16", None)}
    plan_for("sm90", 1, 1, 64, 16)
    assert plan_for("sm90", 32, 2, 4096, 64, "fp8") == first and first.kv_format == "fp8"
    assert others["mxfp4"].kv_format == "mxfp4" and others["bf16"].kv_format == "bf16"
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.num_splits = first.num_splits + 1


def test_env_overrides(monkeypatch):
    monkeypatch.setenv("MLA_BACKEND", "torch")
    assert plan_for("sm90", 4, 1, 1024, 16) == Plan("torch", "bf16", 1, source="heuristic+env")
    monkeypatch.setenv("MLA_KV_FORMAT", "fp8")
    assert plan_for("sm90", 4, 1, 1024, 16).kv_format == "fp8"
    assert plan_for("sm90", 4, 1, 1024, 16, "mxfp4").kv_format == "mxfp4"  # the caller's cache wins
    monkeypatch.setenv("MLA_SPLITS", "7")
    assert plan_for("sm90", 4, 1, 1024, 16).num_splits == 7
    assert plan_for("sm90", 4, 1, 1024, 16, backend="cuda_sm90").backend == "cuda_sm90"  # the argument wins


@pytest.mark.parametrize("name, value, message", [
    ("MLA_BACKEND", "triton", "MLA_BACKEND='triton' is not a backend"),
    ("MLA_KV_FORMAT", "fp4", "MLA_KV_FORMAT='fp4' is not a cache format"),
    ("MLA_SPLITS", "0", "MLA_SPLITS='0' must be an integer in 1..64"),
    ("MLA_SPLITS", "65", "MLA_SPLITS='65' must be an integer in 1..64"),
    ("MLA_SPLITS", "four", "MLA_SPLITS='four' must be an integer in 1..64"),
    ("MLA_SPLITS", "-2", "MLA_SPLITS='-2' must be an integer in 1..64"),
])
def test_bad_env_values_are_clear_errors(monkeypatch, name, value, message):
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as raised:
        plan_for("sm90", 4, 1, 1024, 16)
    assert message in str(raised.value)


def test_a_backend_that_cannot_read_the_format_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="backend 'aiter' cannot read kv_format 'mxfp4'"):
        plan_for("gfx950", 4, 1, 1024, 16, "mxfp4", backend="aiter")
    monkeypatch.setenv("MLA_BACKEND", "aiter")
    assert plan_for("gfx950", 4, 1, 1024, 16).kv_format == "fp8"   # auto picks what aiter reads


def test_table_entries_win_over_the_heuristic(monkeypatch):
    table_plan = {"backend": "cuda_sm90", "kv_format": "fp8", "num_splits": 12, "variant": "x", "page_size": 1}
    _install_table(monkeypatch, "sm90", [_entry(table_plan)])
    assert plan_for("sm90", 4, 1, 1024, 16) == Plan("cuda_sm90", "fp8", 12, "x", 1, "table")
    assert plan_for("sm90", 4, 1, 1024, 16, "fp8").source == "table"       # the auto choice is what was asked
    assert plan_for("sm90", 4, 1, 1024, 16, "mxfp4").source == "heuristic"
    assert plan_for("sm90", 8, 1, 1024, 16).source == "heuristic"           # another shape
    monkeypatch.setenv("MLA_BACKEND", "torch")
    assert plan_for("sm90", 4, 1, 1024, 16).backend == "torch"             # a forced backend skips the entry
    monkeypatch.setenv("MLA_BACKEND", "cuda_sm90")
    monkeypatch.setenv("MLA_SPLITS", "3")
    assert plan_for("sm90", 4, 1, 1024, 16) == Plan("cuda_sm90", "fp8", 3, "x", 1, "table+env")


def test_format_specific_entries(monkeypatch):
    fp8_plan = {"backend": "aiter", "kv_format": "fp8", "num_splits": 16, "variant": "fast", "page_size": 8}
    _install_table(monkeypatch, "gfx950", [_entry(fp8_plan, kv_format="fp8")])
    assert plan_for("gfx950", 4, 1, 1024, 16, "fp8") == Plan("aiter", "fp8", 16, "fast", 8, "table")
    assert plan_for("gfx950", 4, 1, 1024, 16).source == "heuristic"        # no "auto" entry


def test_a_missing_table_means_the_heuristic(monkeypatch, tmp_path):
    monkeypatch.setattr(planner, "_EMBEDDED_TABLES", None)
    monkeypatch.setattr(planner, "TABLE_DIR", tmp_path)
    planner.table_for.cache_clear()
    assert plan_for("sm90", 4, 1, 1024, 16).source == "heuristic"


def test_tables_are_read_from_disk(monkeypatch, tmp_path):
    plan = {"backend": "cuda_sm90", "kv_format": "mxfp4", "num_splits": 5}
    (tmp_path / "h200.json").write_text(json.dumps({"entries": [_entry(plan)]}))
    monkeypatch.setattr(planner, "_EMBEDDED_TABLES", None)
    monkeypatch.setattr(planner, "TABLE_DIR", tmp_path)
    planner.table_for.cache_clear()
    assert plan_for("sm90", 4, 1, 1024, 16) == Plan("cuda_sm90", "mxfp4", 5, "", 1, "table")


def test_a_device_with_a_table_of_its_own_reads_it_and_the_others_the_archs(monkeypatch):
    """An H100 reads h100.json where it exists (measured there), an H200 (or an H100 without it) h200.json."""
    own = {"backend": "cuda_sm90", "kv_format": "mxfp4", "num_splits": 3, "variant": "wgmma"}
    arch_wide = {"backend": "cuda_sm90", "kv_format": "fp8", "num_splits": 5}
    h100 = "NVIDIA H100 80GB HBM3"
    assert planner.own_table_file("sm90", h100) == "h100.json"
    assert planner.own_table_file("sm90", "NVIDIA H200") == planner.own_table_file("sm90") == "h200.json"
    assert planner.table_file("sm90", h100) == "h200.json"   # no h100.json installed
    tables = {name: json.dumps({"entries": [_entry(plan)]}) for name, plan in (("h100.json", own),
                                                                                ("h200.json", arch_wide))}
    monkeypatch.setattr(planner, "_EMBEDDED_TABLES", tables)
    planner.table_for.cache_clear()
    assert planner.table_file("sm90", h100) == "h100.json"
    assert plan_for("sm90", 4, 1, 1024, 16, table=planner.table_file("sm90", h100)) == \
        Plan("cuda_sm90", "mxfp4", 3, "wgmma", 1, "table")
    assert plan_for("sm90", 4, 1, 1024, 16, table=planner.table_file("sm90", "NVIDIA H200")) == \
        Plan("cuda_sm90", "fp8", 5, "", 1, "table")
    assert plan_for("sm90", 4, 1, 1024, 16) == Plan("cuda_sm90", "fp8", 5, "", 1, "table")


@pytest.mark.parametrize("entries, message", [
    ([_entry({"backend": "cuda", "kv_format": "fp8", "num_splits": 4})], "unknown backend 'cuda'"),
    ([_entry({"backend": "aiter", "kv_format": "mxfp4", "num_splits": 4})], "aiter cannot read 'mxfp4'"),
    ([_entry({"backend": "cuda_sm90", "kv_format": "fp8", "num_splits": 0})], "num_splits 0 outside 1..64"),
    ([_entry({"backend": "cuda_sm90", "kv_format": "fp8", "num_splits": 2}, kv_format="bf16")],
     "answers a request for bf16 with a fp8 plan"),
    ([{"batch": 4, "plan": {}}], "KeyError"),
])
def test_malformed_tables_are_clear_errors(monkeypatch, entries, message):
    _install_table(monkeypatch, "sm90", entries)
    with pytest.raises(ValueError, match="planner table h200.json is malformed") as raised:
        plan_for("sm90", 4, 1, 1024, 16)
    assert message in str(raised.value)


@pytest.mark.parametrize("arch, filename", list(planner.TABLE_FILES.items()))
def test_the_committed_tables_parse_into_plans_their_arch_runs(arch, filename):
    table = planner.parse_table((planner.TABLE_DIR / filename).read_text(), filename)
    assert table, f"{filename} has no entries"
    for (batch, q_len, kv_len, num_heads, requested), plan in table.items():
        assert arch in backends.spec(plan.backend).archs, (filename, plan)
        assert requested in ("auto", plan.kv_format), (filename, plan)


def test_candidates_cover_the_backends_variants_and_splits():
    plans = candidates("gfx950", 4, 1, 1024, 16)
    assert plans[0] == plan_for("gfx950", 4, 1, 1024, 16, "bf16")          # heuristic plans come first per format
    assert {p.backend for p in plans} == {"hip_gfx950", "aiter"}
    assert not any(p.backend == "aiter" and p.kv_format == "mxfp4" for p in plans)
    assert {p.variant for p in plans if p.backend == "hip_gfx950"} == {"occ2", "occ3", "occ4"}
    assert {p.page_size for p in plans if p.backend == "aiter"} == {1, 2, 8}
    assert {p.num_splits for p in plans} == {1, 2, 4, 8, 16, 32}          # >= 32 tokens (a tile) per split
    assert len(plans) == len({(p.backend, p.kv_format, p.num_splits, p.variant, p.page_size) for p in plans})


def test_a_format_specific_variant_is_a_candidate_of_its_format_only():
    plans = candidates("sm90", 4, 1, 1024, 16)
    assert {(p.kv_format, p.variant) for p in plans} == {("bf16", ""), ("fp8", ""), ("fp8", "tile64"), ("mxfp4", ""),
                                                         ("mxfp4", "wgmma")}
    assert variants("cuda_sm90", "mxfp4") == ("", "wgmma") and variants("cuda_sm90", "fp8") == ("", "tile64")
    assert variants("torch", "fp8") == ("",)


def test_a_measured_only_variant_is_never_picked_implicitly():
    """cuda_sm90's MXFP4 wgmma kernel has no device evidence: neither the heuristic nor the batch-invariant rewrite
    (which otherwise takes the largest tile) chooses it; a plan that names it keeps it."""
    assert backends.spec("cuda_sm90").measured_only_variants == ("wgmma",)
    plan = plan_for("sm90", 256, 1, 8192, 16, "mxfp4")
    assert plan.variant == ""
    assert planner.batch_invariant_plan(plan, 8192).variant == ""
    named = Plan("cuda_sm90", "mxfp4", 2, "wgmma")
    assert planner.batch_invariant_plan(named, 8192).variant == "wgmma"
    assert planner.batch_invariant_plan(plan_for("sm90", 256, 1, 8192, 16, "fp8"), 8192).variant == "tile64"


def test_the_heuristic_takes_64_token_fp8_tiles_for_long_splits_only():
    long_rows = plan_for("sm90", 256, 1, 8192, 16, "fp8")       # 2 splits of 4096 tokens
    short_rows = plan_for("sm90", 64, 1, 1024, 16, "fp8")       # 4 splits of 256 tokens
    assert (long_rows.source, long_rows.variant) == ("heuristic", "tile64")
    assert (short_rows.source, short_rows.variant) == ("heuristic", "")
    assert plan_for("sm90", 256, 1, 8192, 16, "bf16").variant == ""


def test_candidates_without_a_compiled_backend_are_the_torch_plans(monkeypatch):
    monkeypatch.setenv("MLA_BACKEND", "aiter")  # ignored by candidates
    assert candidates("cpu", 4, 1, 1024, 16) == [Plan("torch", f, 1) for f in KV_FORMATS]
    # the powers of two, and the heuristic's 63 (64 splits of 1600 tokens leave the last one empty)
    assert {p.num_splits for p in candidates("sm90", 2, 1, 100000, 16)} == {2 ** i for i in range(7)} | {63}


# ---- MI355X: every default rests on evidence (issue 31) ----

def _mi355x_document():
    return json.loads((planner.TABLE_DIR / planner.TABLE_FILES["gfx950"]).read_text())


def test_every_mi355x_default_names_evidence_that_its_rule_confirms():
    document = _mi355x_document()
    table = planner.parse_table(json.dumps(document), "mi355x.json", require_evidence=True)
    assert {(key[0], key[2]) for key in table} >= {(b, kv) for b in (4, 32, 64, 256) for kv in (1024, 8192)}
    for entry in document["entries"]:
        plan = table[(entry["batch"], entry["q_len"], entry["kv_len"], entry["num_heads"], entry["kv_format"])]
        claimed = entry["evidence"]["class"]
        assert claimed in planner.EVIDENCE_CLASSES and claimed != planner.LAX_EVIDENCE, entry
        if claimed != "d":   # a, b, c are rules over the configuration: the entry must be exactly that one
            assert planner.evidence_class("gfx950", plan, entry["num_heads"], entry["q_len"], entry["batch"],
                                          entry["kv_len"]) == claimed, entry
        else:
            assert entry.get("strict_error") is not None, entry
    for entry in document.get("opt_in_entries", []):   # the seed's paged aiter routes: lax figures only, no rule covers them
        plan = planner.parse_table(json.dumps({"entries": [], "opt_in_entries": [entry]}), "one", True, True)[(
            entry["batch"], entry["q_len"], entry["kv_len"], entry["num_heads"], entry["kv_format"])]
        assert planner.evidence_class("gfx950", plan, 16, 1) is None, entry


@pytest.mark.parametrize("mutation, message", [
    (lambda e: e.pop("evidence"), "evidence None"),
    (lambda e: e.update(evidence={"class": "lax", "basis": "the seed's lax-checked figures"}), "'lax'"),
    (lambda e: e.update(evidence={"class": "a"}), "'class': 'a'"),
])
def test_a_default_without_evidence_or_on_lax_figures_alone_is_refused(mutation, message):
    document = _mi355x_document()
    mutation(document["entries"][3])
    with pytest.raises(ValueError, match=message):
        planner.parse_table(json.dumps(document), "mi355x.json", require_evidence=True)


def test_the_seed_paged_routes_serve_only_when_opted_in(monkeypatch):
    monkeypatch.setattr(planner, "_EMBEDDED_TABLES", None)
    planner.table_for.cache_clear()
    monkeypatch.delenv(planner.UNVERIFIED_ROUTES_OPT_IN, raising=False)
    reference = Plan("aiter", "fp8", 32, "", 1, "table")
    assert plan_for("gfx950", 32, 1, 8192, 16) == reference
    assert plan_for("gfx950", 256, 1, 1024, 16) == reference
    monkeypatch.setenv(planner.UNVERIFIED_ROUTES_OPT_IN, "1")
    assert plan_for("gfx950", 32, 1, 8192, 16) == Plan("aiter", "fp8", 16, "", 8, "table")
    assert plan_for("gfx950", 256, 1, 1024, 16) == Plan("aiter", "fp8", 1, "fast", 2, "table")
    assert plan_for("gfx950", 4, 1, 1024, 16).backend == "hip_gfx950"   # the evidenced entries stay


@settings(max_examples=200, deadline=None)
@given(batch=st.integers(1, 512), q_len=st.integers(1, 4), kv_len=st.integers(1, 20000),
       num_heads=st.sampled_from([16, 32, 48, 64, 128]), kv_format=st.sampled_from([None, "fp8", "bf16"]))
def test_every_mi355x_heuristic_default_has_evidence(batch, q_len, kv_len, num_heads, kv_format):
    plan = planner.heuristic_plan("gfx950", batch, q_len, kv_len, num_heads, kv_format)
    assert plan.backend == "torch" or planner.evidence_class("gfx950", plan, num_heads, q_len) is not None, plan


def test_mi355x_heuristics_pick_aiter_configurations_its_evidence_covers():
    assert plan_for("gfx950", 64, 1, 1024, 16, "bf16") == Plan("aiter", "bf16", 32, "fast", 1)     # (b)
    assert plan_for("gfx950", 64, 1, 1024, 48, "bf16") == Plan("aiter", "bf16", 32, "fast", 1)     # (b)
    assert plan_for("gfx950", 64, 3, 1024, 16, "bf16").backend == "torch"     # q_len 3: aiter's test has none
    assert plan_for("gfx950", 64, 1, 1024, 16, "fp8", backend="aiter") == Plan("aiter", "fp8", 32, "", 1)  # (a)
    assert planner.evidence_class("gfx950", Plan("aiter", "fp8", 16, "", 1), 16, 1) is None   # not the reference's
