"""Pricing GPU use: rate cards (TOML, effective dates), what each run used per UTC day, co-tenants
on one GPU, and the cost model that turns use into exact money.
"""
