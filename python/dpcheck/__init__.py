"""dpcheck for real training jobs.

``dpcheck.torch`` checks a PyTorch data-parallel job's promises from inside the job (docs/torch.md);
``python3 -m dpcheck.launch`` starts a script's ranks as torchrun would; ``python3 -m dpcheck.conform``
judges PyTorch's own process group with ``dpcheck conform``'s checks. The judging runs in dpcheck's C++
core, ``dpcheck._core`` (and, for dpcheck.conform, the program ``conform-host`` beside it).
"""

from dpcheck._core import version as __version__  # noqa: F401
