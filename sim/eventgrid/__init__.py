"""Azure Event Grid: the app's custom topic with a pull feed standing in for push delivery
(:class:`sim.eventgrid.api.EventGridApi`), and the HealthResources system topic's events
(:mod:`sim.eventgrid.health_resources`).
"""
