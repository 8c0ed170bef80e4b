"""The engine-neutral vocabulary below the engines and above remote/config/store: a release's plan (its
blobs, id and manifest), its units, the requests a health check sends, the health result. deploy, bench,
fleet and the engines all speak it; it names no engine."""
