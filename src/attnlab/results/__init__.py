"""Run records (``results.json``), published paper numbers, and the paper-vs-ours table builder.

Knows nothing of torch models: imports neither torch, Lightning, Hydra nor wandb.
"""

from attnlab.errors import SpecError, TableError
from attnlab.results.build import build_table
from attnlab.results.paper import PaperTables, load_paper_tables
from attnlab.results.record import (
    SCHEMA_VERSION,
    RecordError,
    RunRecord,
    config_hash,
    find_records,
    read_record,
    validate_record,
    write_record,
)
from attnlab.results.spec import list_specs, load_spec

__all__ = [
    "SCHEMA_VERSION",
    "PaperTables",
    "RecordError",
    "RunRecord",
    "SpecError",
    "TableError",
    "build_table",
    "config_hash",
    "find_records",
    "list_specs",
    "load_paper_tables",
    "load_spec",
    "read_record",
    "validate_record",
    "write_record",
]
