"""Embed: packed requests -> vectors, through the service's client, under the budget and the
adaptive in-flight limit."""
