"""Tooling (an extra: ``pip install energon_packing[tools]``): the ``energon-packing`` CLI,
reports, pictures and the training bench. Never imported by the library."""
