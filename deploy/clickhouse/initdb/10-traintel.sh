#!/bin/bash
# Run once by the clickhouse-server image on an empty data volume (docker-entrypoint-initdb.d):
# the collector exporter's tables in database `otel` (the same DDL it runs itself with
# create_schema: true, so whichever comes first wins and the other is a no-op), then traintel's
# views over them, and Jaeger's database.
set -euo pipefail
clickhouse client --query "CREATE DATABASE IF NOT EXISTS otel"
clickhouse client --query "CREATE DATABASE IF NOT EXISTS jaeger"
clickhouse client --database otel --multiquery < /traintel/otel_tables.sql
clickhouse client --database otel --multiquery < /traintel/traintel_views.sql
