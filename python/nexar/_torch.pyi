# Typed stubs of nexar._torch (python/src/torch_backend.cpp).
import datetime
from typing import Any, Sequence

from torch.distributed import ProcessGroup

class ProcessGroupNexar(ProcessGroup):
    def __init__(
        self, comm: Any, timeout: datetime.timedelta, owns: bool = True, ranks: Sequence[int] = ()
    ) -> None:
        """comm: Communicator._capsule(); owns: close the communicator with the group; ranks:
        each member's rank in the default group (for messages; empty: the same numbering)."""
