# Typed stubs of nexar._torch (python/src/torch_backend.cpp).
import datetime
from typing import Any

from torch.distributed import ProcessGroup

class ProcessGroupNexar(ProcessGroup):
    def __init__(self, comm: Any, timeout: datetime.timedelta, owns: bool = True) -> None:
        """comm: Communicator._capsule(); owns: close the communicator with the group."""
