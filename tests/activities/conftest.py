"""Fixtures the activity tests share: the fake API server with the real client, and the ledger's two
stores (SQLite, and DynamoDB on moto's server), and the cloud on moto's server with its nodes in the
fake API server."""

import pytest
from kubernetes import client

from activities.cloud import CloudActivities
from activities.kube import KubeActivities
from activities.ledger import DynamoLedger, SqliteLedger
from sim.fake_kube import FakeKubeServer


@pytest.fixture(params=["sqlite", "dynamodb"])
def ledger(request, tmp_path):
    if request.param == "sqlite":
        return SqliteLedger(tmp_path / "ledger.db")
    ddb = request.getfixturevalue("aws")("dynamodb")
    DynamoLedger.create_table(ddb, "gpuheal-ledger")
    return DynamoLedger(ddb, "gpuheal-ledger")


@pytest.fixture
def kube():
    server = FakeKubeServer().start()
    api = server.api_client()
    core = client.CoreV1Api(api)
    yield server.kube, core, KubeActivities(core)
    api.close()
    server.stop()


OWNED = [{"Key": "gpuheal.io/managed", "Value": "true"}]


@pytest.fixture
def cloud(aws):
    server = FakeKubeServer().start()
    api = server.api_client()
    ec2, asg, ssm = aws("ec2"), aws("autoscaling"), aws("ssm")
    ami = ec2.describe_images()["Images"][0]["ImageId"]

    def instance(node: str, tags=OWNED, in_asg: bool = False) -> str:
        if in_asg:
            ec2.create_launch_template(LaunchTemplateName=f"lt-{node}", LaunchTemplateData={"ImageId": ami,
                                                                                           "InstanceType": "p5.48xlarge"})
            asg.create_auto_scaling_group(AutoScalingGroupName=f"asg-{node}", MinSize=1, MaxSize=2, DesiredCapacity=1,
                                          LaunchTemplate={"LaunchTemplateName": f"lt-{node}"},
                                          AvailabilityZones=["us-east-1a"],
                                          Tags=[{"Key": t["Key"], "Value": t["Value"], "PropagateAtLaunch": True}
                                                for t in tags])
            iid = asg.describe_auto_scaling_groups(AutoScalingGroupNames=[f"asg-{node}"])[
                "AutoScalingGroups"][0]["Instances"][0]["InstanceId"]
        else:
            iid = ec2.run_instances(ImageId=ami, MinCount=1, MaxCount=1, InstanceType="p5.48xlarge",
                                    Placement={"AvailabilityZone": "us-east-1a"},
                                    TagSpecifications=[{"ResourceType": "instance", "Tags": tags}] if tags else [])[
                "Instances"][0]["InstanceId"]
        server.kube.add_node(node, provider_id=f"aws:///us-east-1a/{iid}")
        return iid

    yield CloudActivities.aws(ec2, asg, ssm, client.CoreV1Api(api)), instance, ec2, asg, server.kube
    api.close()
    server.stop()
