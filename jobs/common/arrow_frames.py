"""Arrow data into Spark without pickling or a Python worker: the path `createDataFrame(pandas_df)`
takes in Spark 3.5 (an Arrow IPC stream file read into the JVM), without the detour through pandas.
CDC's change batches and snapshot pieces and the ingest's small batches are made this way."""

from __future__ import annotations

import contextlib
import os
import tempfile

ARROW_BATCH_ROWS = 10_000  # Spark's spark.sql.execution.arrow.maxRecordsPerBatch default
LOCAL_RELATION_THRESHOLD = "spark.sql.execution.arrow.localRelationThreshold"


def arrow_frame(spark, table, schema):
    """A DataFrame of an Arrow table, sent to the JVM as Arrow (no pickling, no Python worker): the
    path `createDataFrame(pandas_df)` takes in Spark 3.5, without the detour through pandas."""
    with tempfile.NamedTemporaryFile(dir=spark.sparkContext._temp_dir, suffix=".arrow", delete=False) as f:
        path = f.name
    write_arrow_file(table, path)
    try:
        return arrow_file_frame(spark, path, schema)
    finally:
        os.unlink(path)


def write_arrow_file(table, path, batch_rows: int = ARROW_BATCH_ROWS) -> None:
    """`table` as an Arrow IPC stream file, in batches of `batch_rows` (by default the size Spark
    reads)."""
    import pyarrow as pa

    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=batch_rows):
            writer.write_batch(batch)


def arrow_file_frame(spark, path, schema, in_tasks: bool = False):
    """A DataFrame of an Arrow IPC stream file (read into the JVM at once: the file may go after).

    By default Spark makes small data (under its `localRelationThreshold`, 48 MB) a local relation:
    rows in the query plan, which suits a MERGE's change batch (known size: a broadcast join). But
    the optimizer walks such a plan's rows in every rule: 200,000 rows cost seconds of CPU per
    statement (JFR profile of CDC's 1M-row snapshot: two thirds of the JVM's samples). `in_tasks`
    makes it an RDD instead, one partition per Arrow batch, decoded by the tasks that write it."""
    from pyspark.sql import DataFrame

    utils = spark.sparkContext._jvm.org.apache.spark.sql.api.python.PythonSQLUtils
    batches = utils.readArrowStreamFromFile(str(path))
    with _no_local_relation(spark) if in_tasks else contextlib.nullcontext():
        return DataFrame(utils.toDataFrame(batches, schema.json(), spark._jsparkSession), spark)


@contextlib.contextmanager
def _no_local_relation(spark):
    """Arrow data becomes an RDD, however small. A setting of the whole session, read as a frame is
    made: set for that moment only. Only CDC's snapshot sets it, from one thread; a frame another
    job makes meanwhile (the ingest's small batches) may become an RDD too, which changes its plan,
    not its rows."""
    previous = spark.conf.get(LOCAL_RELATION_THRESHOLD, None)
    spark.conf.set(LOCAL_RELATION_THRESHOLD, "0")
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(LOCAL_RELATION_THRESHOLD)
        else:
            spark.conf.set(LOCAL_RELATION_THRESHOLD, previous)
