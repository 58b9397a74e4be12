"""Where results live: the DuckDB store, run folders, the writer's lock, provenance.

The run folder protocol and its status vocabulary (rundir), the one-writer lock
(lock), the DuckDB schema, migrations and ingest (database), and what every number
carries: device, versions, commit and measured peaks (provenance, cpupeak). May
import ``abl.grid`` and the layers below it.
"""
