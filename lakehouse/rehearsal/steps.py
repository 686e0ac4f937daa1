"""The EMR steps the deployment would submit, read from the synthesized assembly:

- the streaming steps: the step supervisor Lambda's `STREAMING_STEPS_S3_URI`, i.e. the
  `streaming-steps.json` the Jobs stack uploads (deploy-time markers replaced);
- the batch steps: each state machine's `addStep.sync` task, its arguments either literal or built
  at run time by a `States.Array(...)` Pass state from the execution input (gendata).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from lakehouse.rehearsal.assembly import AssemblyError, CloudAssembly, Resolver, require_resolved
from lakehouse.rehearsal.local_s3 import LocalS3

ADD_STEP_SYNC = ":states:::elasticmapreduce:addStep.sync"


@dataclass(frozen=True)
class StepDefinition:
    job: str
    name: str
    jar: str
    args: list[str]
    source: str  # where the rehearsal found it


def streaming_steps(assembly: CloudAssembly, resolver: Resolver, s3: LocalS3) -> list[StepDefinition]:
    supervisors = [
        f
        for f in assembly.resources("AWS::Lambda::Function")
        if "STREAMING_STEPS_S3_URI" in f.properties.get("Environment", {}).get("Variables", {})
    ]
    if len(supervisors) != 1:
        raise AssemblyError(f"expected one step supervisor Lambda, found {len(supervisors)}")
    (supervisor,) = supervisors
    uri = resolver.resolve(
        supervisor.stack, supervisor.properties["Environment"]["Variables"]["STREAMING_STEPS_S3_URI"]
    )
    require_resolved("STREAMING_STEPS_S3_URI", uri)
    path = s3.path_of(uri)
    if not path.exists():
        raise AssemblyError(f"the supervisor reads {uri}, which no BucketDeployment uploads")
    steps = json.loads(path.read_text())
    require_resolved(uri, steps)
    return [
        StepDefinition(step["job"], f"lakehouse-{step['job']}@{step['version']}", "command-runner.jar",
                       [str(a) for a in step["args"]], uri)
        for step in steps
    ]  # fmt: skip


def batch_steps(
    assembly: CloudAssembly, resolver: Resolver, inputs: dict[str, dict]
) -> dict[str, StepDefinition]:
    """job -> its step, from every state machine that adds an EMR step; `inputs[job]` is the
    execution input where the arguments are built at run time."""
    found = {}
    for machine in assembly.resources("AWS::StepFunctions::StateMachine"):
        definition = json.loads(resolver.resolve(machine.stack, machine.properties["DefinitionString"]))
        for state_name, state in definition["States"].items():
            if not str(state.get("Resource", "")).endswith(ADD_STEP_SYNC):
                continue
            step = state["Parameters"]["Step"]
            job = step["Name"].removeprefix("lakehouse-")
            jar_step = step["HadoopJarStep"]
            if "Args" in jar_step:
                args = jar_step["Args"]
            else:
                args = _args_at_run_time(definition, jar_step["Args.$"], inputs.get(job))
            require_resolved(f"state machine {machine.logical_id} {state_name}", args)
            found[job] = StepDefinition(job, step["Name"], jar_step["Jar"], [str(a) for a in args],
                                        f"{machine.stack}/{machine.logical_id}")  # fmt: skip
    return found


def _args_at_run_time(definition: dict, path: str, execution_input: dict | None) -> list[str]:
    """Evaluate the Pass state that builds `path` (e.g. `$.step.args`) from the execution input."""
    if execution_input is None:
        raise AssemblyError(f"the step's arguments come from the execution input ({path}): give one")
    state = dict(execution_input)
    for candidate in definition["States"].values():
        if candidate.get("Type") != "Pass" or "Parameters" not in candidate:
            continue
        result = {}
        for key, expression in candidate["Parameters"].items():
            if key.endswith(".$"):
                result[key.removesuffix(".$")] = evaluate_intrinsic(expression, state)
            else:
                result[key] = expression
        target = candidate.get("ResultPath", "$").removeprefix("$.")
        state[target] = result
    value = _json_path(state, path)
    if not isinstance(value, list):
        raise AssemblyError(f"{path} is not a list after the Pass states")
    return value


_TOKEN = re.compile(r"\s*(?:'((?:\\.|[^'\\])*)'|(\$[.\w]*))\s*(,|$)")


def evaluate_intrinsic(expression: str, state: dict):
    """`States.Array('literal', $.path, …)` (the one intrinsic the deployment uses)."""
    if not (expression.startswith("States.Array(") and expression.endswith(")")):
        raise AssemblyError(f"unsupported Step Functions intrinsic: {expression[:60]}")
    body = expression[len("States.Array(") : -1]
    values, position = [], 0
    while position < len(body):
        match = _TOKEN.match(body, position)
        if match is None:
            raise AssemblyError(f"cannot parse States.Array arguments at: {body[position : position + 40]}")
        literal, path = match.group(1), match.group(2)
        values.append(re.sub(r"\\(.)", r"\1", literal) if literal is not None else _json_path(state, path))
        position = match.end()
    return values


def _json_path(state: dict, path: str):
    value = state
    for part in path.removeprefix("$").strip(".").split("."):
        if part:
            if not isinstance(value, dict) or part not in value:
                raise AssemblyError(f"the execution input has no {path}")
            value = value[part]
    return value
