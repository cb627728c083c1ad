"""The record formats: KPL aggregation (protobuf) and the columnar batches records travel in."""
