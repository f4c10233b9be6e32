"""A fleet's collections in one dataset: publish them to any filesystem pyarrow opens
(``kernmlops push``), list them through a small index (``kernmlops fleet ls``), and
summarise them with Spark (``kernmlops spark-job``).

The dataset is the Hive layout of a local ``curated/`` folder, under any URI::

    <URI>/benchmark=<b>/collection_id=<id>/manifest.json
    <URI>/benchmark=<b>/collection_id=<id>/<table>/part-*.parquet
    <URI>/_index/<collection_id>.parquet        one row per published collection
    <URI>/_damaged/<collection_id>.json         one that reindex found damaged (no row)

A collection is published when its manifest and its index row are there: parts are
copied first, the manifest and the index row last.
"""

from kernmlops.fleet.store import Dataset, PublishError, open_dataset, probe

__all__ = ["Dataset", "PublishError", "open_dataset", "probe"]
