"""The embedded local stack that stands in for MSK, RDS, Glue and S3 on one machine."""
