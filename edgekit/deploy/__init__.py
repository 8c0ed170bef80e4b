"""Deploy: compose a release from built and converted artifacts, push it, activate it, check health."""
