"""EmbedPipeOptions keeps one view per options class; the views behave as Beam's own."""
import copy
import pickle

from apache_beam.options.pipeline_options import GoogleCloudOptions, StandardOptions, TypeOptions

from pipeline.settings.options import EmbedPipeOptions


def test_a_view_is_made_once_per_class_and_shares_the_values():
    opts = EmbedPipeOptions(["--runner", "FnApiRunner", "--max_spend_rub", "5"])
    standard = opts.view_as(StandardOptions)
    assert opts.view_as(StandardOptions) is standard and opts.view_as(TypeOptions) is not standard
    standard.runner = "DirectRunner"
    assert opts.view_as(StandardOptions).runner == "DirectRunner"
    assert opts.view_as(EmbedPipeOptions).max_spend_rub == 5.0


def test_a_copy_or_a_pickle_has_views_of_its_own_values():
    opts = EmbedPipeOptions(["--runner", "FnApiRunner"])
    opts.view_as(StandardOptions)
    for other in (copy.deepcopy(opts), pickle.loads(pickle.dumps(opts))):
        other.view_as(StandardOptions).runner = "DirectRunner"
        assert other.get_all_options()["runner"] == "DirectRunner"   # what Beam sends a runner
        assert opts.view_as(StandardOptions).runner == "FnApiRunner"


def test_a_pickle_drops_the_impersonated_account_even_after_a_view_showed_it():
    opts = EmbedPipeOptions(["--impersonate_service_account", "someone@example.iam"])
    assert opts.view_as(GoogleCloudOptions).impersonate_service_account == "someone@example.iam"
    unpickled = pickle.loads(pickle.dumps(opts))
    assert unpickled.view_as(GoogleCloudOptions).impersonate_service_account is None
    unpickled.view_as(GoogleCloudOptions).project = "p"   # and its views share its values still
    assert unpickled.get_all_options()["project"] == "p"
    assert opts.view_as(GoogleCloudOptions).impersonate_service_account == "someone@example.iam"
