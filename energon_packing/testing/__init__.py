"""Test and demo support: generated conversations (:mod:`.synth`) and the tiny reference model
(:mod:`.model`). Never imported by the library; the tools and the tests use it."""
