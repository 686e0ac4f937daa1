"""The local Spark JVM's memory settings, read from the running session's JVM."""

from __future__ import annotations


def test_spark_buffers_of_every_batch_are_not_humongous_objects(spark):
    """G1 allocates each object of more than half a region straight into old-generation regions,
    and each such allocation may start a concurrent cycle. With the default
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
    # Spark reads a unit-less spark.broadcast.blockSize in KiB.
    conf = spark.sparkContext._jsc.sc().conf()
    broadcast_block = conf.getSizeAsKb("spark.broadcast.blockSize", "4m") * 1024
    task_result_chunk = jvm.org.apache.spark.util.io.ChunkedByteBuffer.estimateBufferChunkSize(-1)
    buffers = {"page": page, "broadcast block": broadcast_block, "task-result chunk": task_result_chunk}
    humongous = {name: size for name, size in buffers.items() if size >= region // 2}
    assert not humongous, f"humongous in {region >> 20} MB regions: {humongous}"
