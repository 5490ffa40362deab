"""The port guard's rules as text (launcher/port_rules.py): the iptables
commands that close a job's ports and remove exactly them, and the shell
scripts a host runs. Nothing here needs root."""

import subprocess

from resnet_keras.launcher import port_rules

RULES = port_rules.Rules('RESNET_KERAS_7_ab12cd', ('10.0.0.1', 'fd00::2'),
                         ((2410, 2411), (5050, 5050)))


def test_add_commands_return_the_jobs_hosts_and_reset_the_rest():
  chain = RULES.chain
  assert port_rules.add_commands(RULES, 'iptables') == [
      ['iptables', '-w', '-N', chain],
      ['iptables', '-w', '-A', chain, '-i', 'lo', '-j', 'RETURN'],
      ['iptables', '-w', '-A', chain, '-s', '10.0.0.1', '-j', 'RETURN'],
      ['iptables', '-w', '-A', chain, '-p', 'tcp', '-j', 'REJECT',
       '--reject-with', 'tcp-reset'],
      ['iptables', '-w', '-I', 'INPUT', '-p', 'tcp', '--dport', '2410:2411',
       '-j', chain],
      ['iptables', '-w', '-I', 'INPUT', '-p', 'tcp', '--dport', '5050:5050',
       '-j', chain]]
  # Each family's addresses to its own tool.
  assert ['ip6tables', '-w', '-A', chain, '-s', 'fd00::2', '-j', 'RETURN'] \
      in port_rules.add_commands(RULES, 'ip6tables')


def test_remove_commands_undo_exactly_the_chains_jumps_and_the_chain():
  chain = RULES.chain
  assert port_rules.remove_commands(RULES, 'iptables') == [
      ['iptables', '-w', '-D', 'INPUT', '-p', 'tcp', '--dport', '2410:2411',
       '-j', chain],
      ['iptables', '-w', '-D', 'INPUT', '-p', 'tcp', '--dport', '5050:5050',
       '-j', chain],
      ['iptables', '-w', '-F', chain], ['iptables', '-w', '-X', chain]]


def test_the_add_script_checks_first_and_undoes_a_half_done_add():
  script = port_rules.add_script(RULES)
  assert script.startswith('[ "$(id -u)" = 0 ] || { echo not root; exit 3; }')
  assert 'ip6tables -w -N' in script
  assert script.endswith(f'|| {{ {port_rules.remove_script(RULES)}; exit 4; }}')


def test_a_script_that_cannot_run_says_why_in_its_output(tmp_path):
  # As a host without iptables answers: its PATH holds no iptables.
  done = subprocess.run(['/bin/sh', '-c', port_rules.add_script(RULES)],
                        env={'PATH': str(tmp_path)}, capture_output=True,
                        text=True)
  assert done.returncode == 3
  assert done.stdout.strip() in ('not root', 'no iptables')


def test_chain_names_are_the_launchs_own_and_fit_iptables():
  name = port_rules.chain_name()
  assert name.startswith('RESNET_KERAS_') and len(name) <= 28
  assert name != port_rules.chain_name()

