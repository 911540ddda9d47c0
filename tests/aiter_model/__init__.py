"""A model of AMD aiter's persistent MLA decode, written from aiter's public source (test equipment, not shipped).

metadata.py: the metadata builders behind get_mla_metadata_v1 (v1_0 and v1_2 "fast"), with citations.
mutations.py: plausible misreadings of aiter's source, which the tests show they would reject.
fake_aiter.py: fake `aiter` / `aiter.mla` modules with the real signatures whose metadata call runs the model and
whose decode call computes attention from the work items the model wrote, so the route is tested against what
aiter's builders actually emit rather than against our own idea of it.
"""
