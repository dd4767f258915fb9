from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet: providers, daemons and their orders"

    def ready(self):
        # The drivers register themselves in fleet.driver_base.DRIVERS as they load (as
        # Django's admin modules do), so that the daemon lifecycle can reach them
        # without importing them: they import it (a cycle otherwise). The tasks connect
        # the receiver of a submit's wake (jobs/serving.wake_wanted). Both import models,
        # which are not loaded yet when this module is: Django's place for it is here.
        from fleet import drivers, tasks  # noqa: F401, PLC0415
