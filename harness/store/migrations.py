"""The store's schema as numbered migrations: ``abl.store.database.migrate`` applies the ones a store lacks.

Each runs once, in version order, inside a transaction, and is recorded in ``schema_migrations``.
"""

from __future__ import annotations

# Each migration runs once, in order, inside a transaction; never edit one
# that has shipped: append a new one.
MIGRATIONS: list[tuple[int, str, str]] = [
    (1, "runs and metrics", """
        CREATE TABLE runs (
            run_id VARCHAR PRIMARY KEY,
            experiment VARCHAR NOT NULL,
            cell_key VARCHAR,
            label VARCHAR,
            seed INTEGER,
            status VARCHAR NOT NULL,
            config JSON,
            started TIMESTAMP,
            finished TIMESTAMP,
            git_commit VARCHAR,
            versions JSON,
            device VARCHAR,
            env JSON,
            data_fingerprint VARCHAR,
            grid_file VARCHAR,
            notes VARCHAR,
            error VARCHAR
        );
        CREATE TABLE metrics (
            run_id VARCHAR NOT NULL,
            step INTEGER NOT NULL,
            name VARCHAR NOT NULL,
            value DOUBLE
        );
        CREATE INDEX metrics_run ON metrics (run_id, name);
    """),
    (3, "resume bookkeeping", """
        ALTER TABLE runs ADD COLUMN attempts INTEGER DEFAULT 1;
        ALTER TABLE runs ADD COLUMN code_changed BOOLEAN DEFAULT false;
        ALTER TABLE runs ADD COLUMN executor VARCHAR
    """),
    (5, "kernel benchmarks", """
        CREATE TABLE bench (
            bench_id VARCHAR NOT NULL,
            created TIMESTAMP,
            op VARCHAR NOT NULL,
            provider VARCHAR NOT NULL,
            shape VARCHAR,
            dtype VARCHAR,
            pass VARCHAR,
            p20 DOUBLE,
            p50 DOUBLE,
            p80 DOUBLE,
            gbps DOUBLE,
            tflops DOUBLE,
            peak_fraction DOUBLE,
            peak_basis VARCHAR,
            device VARCHAR,
            versions JSON,
            git_commit VARCHAR,
            timing VARCHAR,
            notes VARCHAR
        );
        CREATE INDEX bench_op ON bench (op, provider)
    """),
    (6, "selftest reports", """
        CREATE TABLE selftest (
            selftest_id VARCHAR NOT NULL,
            created TIMESTAMP,
            section VARCHAR NOT NULL,
            name VARCHAR NOT NULL,
            status VARCHAR NOT NULL,
            value DOUBLE,
            unit VARCHAR,
            reference DOUBLE,
            detail VARCHAR,
            data JSON,
            device VARCHAR,
            quick BOOLEAN,
            versions JSON,
            git_commit VARCHAR
        );
        CREATE INDEX selftest_id ON selftest (selftest_id, section)
    """),
    (7, "what the grid knew", """
        ALTER TABLE runs ADD COLUMN grid_paths JSON;
        ALTER TABLE runs ADD COLUMN grid_index INTEGER;
        ALTER TABLE runs ADD COLUMN grid_varied JSON;
        CREATE TABLE run_settings (
            run_id VARCHAR NOT NULL,
            path VARCHAR NOT NULL,
            value JSON
        );
        CREATE INDEX run_settings_run ON run_settings (run_id)
    """),
    (8, "which plugin provided each component", "ALTER TABLE runs ADD COLUMN plugins JSON"),
    (9, "speed measured alone", """
        CREATE TABLE speed_pass (
            run_id VARCHAR NOT NULL,
            shape VARCHAR NOT NULL,
            timed_run VARCHAR,
            tokens_per_s DOUBLE,
            mfu DOUBLE,
            warmup_steps INTEGER,
            timed_steps INTEGER,
            device VARCHAR,
            created TIMESTAMP,
            reason VARCHAR
        );
        CREATE INDEX speed_pass_run ON speed_pass (run_id)
    """),
]
