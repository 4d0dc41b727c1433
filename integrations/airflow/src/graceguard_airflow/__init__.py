"""Airflow integrations of graceguard."""
