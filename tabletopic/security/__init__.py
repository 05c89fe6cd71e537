"""Authentication of the broker's clients: listeners and their security protocols, TLS from PEM files, SASL
(PLAIN, SCRAM-SHA-256/512) as Apache Kafka serves them, and the SCRAM credentials the broker keeps."""
