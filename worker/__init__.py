"""Per-partition table-topic workers: records → Arrow → Parquet data files (issue 4; not built yet).

This package will own reading a partition's committed log range, converting records with the topic's
``automq.table.topic.convert.*`` settings, and writing Parquet files with Iceberg field ids for the
coordinator to commit. Nothing here runs yet.
"""
