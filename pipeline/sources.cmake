# pipeline's sources (relative to pipeline/), shared by the native build and the wasm build.
set(TANDEM_PIPELINE_SOURCES stage.cpp schedule.cpp local_pipeline.cpp partitioner.cpp stage_peer.cpp event_link.cpp link_filter.cpp)
