"""The local Spark JVM's memory settings, read from the running session's JVM."""

from __future__ import annotations

# Spark serializes task results into chunks of this size (SerializerHelper.serializeToChunkedBuffer).
TASK_RESULT_CHUNK_BYTES = 1 << 20


def test_spark_buffers_of_every_batch_are_not_humongous_objects(spark):
    """G1 starts a concurrent cycle for each object of half a region or more. With the default
    2 MB regions of a 3 GB heap, each aggregation page (32 MB), broadcast block (4 MB, one per stage)
    and task-result chunk (1 MB) was one: 3.9 of 4.5 s of GC pauses in the streaming application's
    first 85 s (issue 26)."""
    jvm = spark._jvm
    diagnostics = jvm.java.lang.management.ManagementFactory.getPlatformMXBean(
        jvm.java.lang.Class.forName("com.sun.management.HotSpotDiagnosticMXBean")
    )
    region = int(diagnostics.getVMOption("G1HeapRegionSize").getValue())
    assert diagnostics.getVMOption("UseG1GC").getValue() == "true"
    page = jvm.org.apache.spark.SparkEnv.get().memoryManager().pageSizeBytes()
    broadcast_block = spark.sparkContext._jsc.sc().conf().getSizeAsBytes("spark.broadcast.blockSize", "4m")
    buffers = {"page": page, "broadcast block": broadcast_block, "task-result chunk": TASK_RESULT_CHUNK_BYTES}
    humongous = {name: size for name, size in buffers.items() if size >= region // 2}
    assert not humongous, f"humongous in {region >> 20} MB regions: {humongous}"
