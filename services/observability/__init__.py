"""What a running worker tells about itself: its health report and its Prometheus gauges."""
