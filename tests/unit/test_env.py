"""The process environment set before TensorFlow loads (common/env.py):
oneDNN on x86-64, XLA on CPUs. (What a fresh process records: processes/.)"""

import platform

import pytest

from common import env


@pytest.fixture
def clean_env(monkeypatch):
  for name in (env.ONEDNN_VAR, env.ONEDNN_DEFAULTED_VAR):
    monkeypatch.delenv(name, raising=False)
  return monkeypatch


def test_onednn_is_turned_on_on_x86_64_unless_the_user_chose(clean_env):
  clean_env.setattr(platform, 'machine', lambda: 'x86_64')
  env.prepare_tensorflow_environment()
  assert env.os.environ[env.ONEDNN_VAR] == '1'
  assert 'set by resnet_keras' in env.onednn_reason(env.os.environ)

  clean_env.setenv(env.ONEDNN_VAR, '0')
  clean_env.delenv(env.ONEDNN_DEFAULTED_VAR)
  env.prepare_tensorflow_environment()
  assert env.os.environ[env.ONEDNN_VAR] == '0'
  assert env.onednn_reason(env.os.environ) == (
      'TF_ENABLE_ONEDNN_OPTS=0 set in the environment')


def test_other_cpus_keep_tensorflows_default(clean_env):
  clean_env.setattr(platform, 'machine', lambda: 'aarch64')
  env.prepare_tensorflow_environment()
  assert env.ONEDNN_VAR not in env.os.environ
  assert env.onednn_reason(env.os.environ, machine='aarch64') == (
      "TF_ENABLE_ONEDNN_OPTS unset on a aarch64 CPU: TensorFlow's own default")


def test_a_user_value_of_1_is_the_users():
  assert env.onednn_reason({env.ONEDNN_VAR: '1'}) == (
      'TF_ENABLE_ONEDNN_OPTS=1 set in the environment')


def test_xla_on_cpu_adds_its_flag_once_and_keeps_the_users():
  """(test_main's XLA run shows that the flag makes --enable_xla compile.)"""
  environ = {}
  env.allow_xla_on_cpu(environ)
  assert environ == {'TF_XLA_FLAGS': '--tf_xla_cpu_global_jit'}
  environ = {'TF_XLA_FLAGS': '--tf_xla_auto_jit=2'}
  env.allow_xla_on_cpu(environ)
  env.allow_xla_on_cpu(environ)
  assert environ['TF_XLA_FLAGS'] == ('--tf_xla_auto_jit=2 '
                                     '--tf_xla_cpu_global_jit')
