"Measurements: the roofline, offline throughput, kernel timings and online load tests."
