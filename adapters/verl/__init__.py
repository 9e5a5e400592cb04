"""verl 0.9.1 adapter: any environment as a verl agent loop, and ``backend=verl`` for ``bridges.train``.

Importing this package does not import verl: ``write_verl_parquet`` and the launcher run without
it (``dry_run=true`` works on any machine); ``adapters.verl.agent_loop`` is imported by verl's own
workers, from the YAML the launcher writes.
"""

from bridges.adapters.verl.dataset import row_from_kwargs, verl_rows, write_verl_parquet
from bridges.adapters.verl.engine import VerlServerEngine

__all__ = ["VerlServerEngine", "row_from_kwargs", "verl_rows", "write_verl_parquet"]
