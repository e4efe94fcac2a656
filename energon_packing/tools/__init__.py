"""Tooling (the ``[tools]`` extra: ``pip install '.[tools]'`` in the checkout): the
``energon-packing`` CLI, reports, pictures and the training bench. Never imported by the
library."""
