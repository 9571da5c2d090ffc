"""What a run is told: flags (a PipelineOptions subclass), configs/, profiles, resolved once into a Job."""
