"""dpcheck for real training jobs.

``dpcheck.torch`` checks a PyTorch data-parallel job's promises from inside the job (docs/torch.md);
``python3 -m dpcheck.launch`` starts a script's ranks as torchrun would. The judging runs in dpcheck's
C++ core, ``dpcheck._core``.
"""

from dpcheck._core import version as __version__  # noqa: F401
