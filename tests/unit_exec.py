#!/usr/bin/env python3
"""Turns an installed systemd unit into the command line systemd would run.

usage: unit_exec.py UNIT_FILE [--instance I] [--root DESTDIR]

Prints a JSON object: argv (ExecStart expanded as systemd does: %i, %H, %%,
${VAR} as one argument, $VAR split on whitespace, an unset variable as
nothing), env (Environment= then EnvironmentFile=, the latter winning), and
cwd (WorkingDirectory=). Absolute paths of files the unit reads (binaries,
EnvironmentFile=, and values that name them) are looked up under --root, the
install's DESTDIR, so the test runs exactly the installed command lines.
"""
import json
import re
import shlex
import socket
import sys


def parse_unit(path):
    entries = []
    section = None
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
                continue
            key, _, value = line.partition("=")
            entries.append((section, key.strip(), value.strip()))
    return entries


def specifiers(text, instance):
    def sub(m):
        c = m.group(1)
        if c == "i":
            return instance
        if c == "H":
            return socket.gethostname()
        if c == "%":
            return "%"
        raise SystemExit(f"unit_exec: specifier %{c} not handled")
    return re.sub(r"%(.)", sub, text)


def read_env_file(path, env):
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line.startswith(("#", ";")):
                continue
            key, _, value = line.partition("=")
            value = value.strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            env[key.strip()] = value


def expand_exec(words, env):
    argv = []
    for word in words:
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if m:  # $VAR: split into words; unset or empty: no argument
            argv.extend(env.get(m.group(1), "").split())
            continue
        argv.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                           lambda m: env.get(m.group(1), ""), word))
    return argv


def main():
    args = sys.argv[1:]
    unit, instance, root = args[0], "", ""
    i = 1
    while i < len(args):
        if args[i] == "--instance":
            instance = args[i + 1]
        elif args[i] == "--root":
            root = args[i + 1].rstrip("/")
        else:
            raise SystemExit(f"unit_exec: unknown argument {args[i]}")
        i += 2
    env, exec_start, cwd = {}, None, None
    env_files = []
    for section, key, value in parse_unit(unit):
        if section != "Service":
            continue
        value = specifiers(value, instance)
        if key == "Environment":
            for assignment in shlex.split(value):
                k, _, v = assignment.partition("=")
                env[k] = v
        elif key == "EnvironmentFile":
            env_files.append(value)
        elif key == "ExecStart":
            exec_start = value
        elif key == "WorkingDirectory":
            cwd = value
    for path in env_files:  # systemd reads them after Environment=
        optional = path.startswith("-")
        path = root + path.lstrip("-")
        try:
            read_env_file(path, env)
        except FileNotFoundError:
            if not optional:
                raise
    if exec_start is None:
        raise SystemExit(f"unit_exec: {unit} has no ExecStart=")
    argv = expand_exec(shlex.split(exec_start), env)
    argv[0] = root + argv[0]
    print(json.dumps({"argv": argv, "env": env, "cwd": cwd}))


if __name__ == "__main__":
    main()
