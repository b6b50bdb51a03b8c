// Package k8s_test checks the Kubernetes manifests of deploy/k8s against the Kubernetes
// API types (strict: an unknown or misspelled field fails) and against toolbus itself.
package k8s_test

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/toolbus/toolbus/events"
	"github.com/toolbus/toolbus/executor"
	"github.com/toolbus/toolbus/executor/packs"
)

// scaledObject is the part of KEDA's keda.sh/v1alpha1 ScaledObject the manifests use
// (KEDA's CRD types are not a dependency of toolbus); decoding is strict, so a field
// outside it fails.
type scaledObject struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		ScaleTargetRef struct {
			Name string `json:"name"`
		} `json:"scaleTargetRef"`
		MinReplicaCount *int32 `json:"minReplicaCount"`
		MaxReplicaCount *int32 `json:"maxReplicaCount"`
		PollingInterval *int32 `json:"pollingInterval"`
		CooldownPeriod  *int32 `json:"cooldownPeriod"`
		Triggers        []struct {
			Type     string            `json:"type"`
			Metadata map[string]string `json:"metadata"`
		} `json:"triggers"`
	} `json:"spec"`
}

type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Namespace  string   `json:"namespace"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

type manifests struct {
	kustomization kustomization
	deployments   map[string]*appsv1.Deployment
	jobs          []*batchv1.Job
	configMaps    map[string]*corev1.ConfigMap
	scaled        []*scaledObject
	services      []*corev1.Service
}

// load decodes every document of the files the kustomization.yaml of dir lists (the
// base "." or "optional"), strictly, with the type its apiVersion and kind name.
func load(t *testing.T, dirs ...string) manifests {
	t.Helper()
	if len(dirs) == 0 {
		dirs = []string{"."}
	}
	m := manifests{deployments: map[string]*appsv1.Deployment{}, configMaps: map[string]*corev1.ConfigMap{}}
	for _, dir := range dirs {
		loadDir(t, dir, &m)
	}
	return m
}

func loadDir(t *testing.T, dir string, m *manifests) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(raw, &k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	m.kustomization = k
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range files {
		f = filepath.Base(f)
		if f != "kustomization.yaml" && f != "nats-values.yaml" && !slices.Contains(k.Resources, f) {
			t.Errorf("%s/%s is not listed in its kustomization.yaml", dir, f)
		}
	}
	for _, f := range k.Resources {
		raw, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range bytes.Split(raw, []byte("\n---\n")) {
			var tm metav1.TypeMeta
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s doc %d: %v", f, i, err)
			}
			var obj any
			switch tm.APIVersion + " " + tm.Kind {
			case "apps/v1 Deployment":
				d := &appsv1.Deployment{}
				m.deployments[f] = d
				obj = d
			case "batch/v1 Job":
				j := &batchv1.Job{}
				m.jobs = append(m.jobs, j)
				obj = j
			case "v1 ConfigMap":
				obj = &corev1.ConfigMap{}
			case "v1 Service":
				sv := &corev1.Service{}
				m.services = append(m.services, sv)
				obj = sv
			case "v1 Namespace":
				obj = &corev1.Namespace{}
			case "keda.sh/v1alpha1 ScaledObject":
				s := &scaledObject{}
				m.scaled = append(m.scaled, s)
				obj = s
			default:
				t.Fatalf("%s doc %d: unexpected %s %s", f, i, tm.APIVersion, tm.Kind)
			}
			if err := yaml.UnmarshalStrict(doc, obj); err != nil {
				t.Fatalf("%s doc %d (%s): %v", f, i, tm.Kind, err)
			}
			if c, ok := obj.(*corev1.ConfigMap); ok {
				m.configMaps[c.Name] = c
			}
			if meta, ok := obj.(metav1.Object); ok && tm.Kind != "Namespace" && meta.GetNamespace() != k.Namespace {
				t.Errorf("%s doc %d: namespace %q, want %q", f, i, meta.GetNamespace(), k.Namespace)
			}
		}
	}
}

func TestManifestsParse(t *testing.T) {
	m := load(t)
	roles := map[string]int{}
	for f, d := range m.deployments {
		sel := d.Spec.Selector.MatchLabels
		for k, v := range sel {
			if d.Spec.Template.Labels[k] != v {
				t.Errorf("%s: the selector %s=%s does not match the pod template", f, k, v)
			}
		}
		c := d.Spec.Template.Spec.Containers
		if len(c) != 1 || len(c[0].Args) == 0 {
			t.Fatalf("%s: want one container with a role argument", f)
		}
		roles[c[0].Args[0]]++
		for probe, path := range map[*corev1.Probe]string{c[0].LivenessProbe: "/healthz", c[0].ReadinessProbe: "/readyz"} {
			if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != path {
				t.Errorf("%s: no %s probe", f, path)
			}
		}
		if c[0].Image != "toolbus" {
			t.Errorf("%s: image %q, want \"toolbus\" (kustomization.yaml's images entry names the real one)", f, c[0].Image)
		}
	}
	for _, r := range []string{"planner", "executor", "injector"} {
		if roles[r] == 0 {
			t.Errorf("no Deployment runs the %s role", r)
		}
	}
	if len(m.jobs) != 1 || m.jobs[0].Spec.Template.Spec.Containers[0].Args[0] != "init" {
		t.Errorf("want one Job running toolbus init")
	}
	cfg := m.configMaps["toolbus"]
	if cfg == nil || cfg.Data["TOOLBUS_METRICS_ADDR"] == "" || cfg.Data["TOOLBUS_REPLICAS"] != "3" {
		t.Errorf("ConfigMap toolbus must set TOOLBUS_METRICS_ADDR and TOOLBUS_REPLICAS=3: %+v", cfg)
	}
}

// Each ScaledObject scales an executor Deployment by the queues of exactly the tools it
// serves: nats-jetstream triggers on the consumers events.ToolConsumer(tool) of the
// queue stream (events.QueueStreamName), tools that exist in the packs.
func TestScaledObjectsWatchTheToolQueues(t *testing.T) {
	m := load(t)
	reg := executor.NewRegistry()
	if err := packs.Register(reg, "demo", "diag"); err != nil {
		t.Fatal(err)
	}
	byName := map[string]*appsv1.Deployment{}
	for _, d := range m.deployments {
		byName[d.Name] = d
	}
	if len(m.scaled) == 0 {
		t.Fatal("no ScaledObject")
	}
	scaledTargets := map[string]bool{}
	for _, so := range m.scaled {
		d := byName[so.Spec.ScaleTargetRef.Name]
		if d == nil {
			t.Fatalf("ScaledObject %s targets %q, which is not a Deployment here", so.Name, so.Spec.ScaleTargetRef.Name)
		}
		scaledTargets[d.Name] = true
		var tools []string
		for _, e := range d.Spec.Template.Spec.Containers[0].Env {
			if e.Name == "TOOLBUS_EXECUTOR_TOOLS" {
				tools = strings.Split(e.Value, ",")
			}
		}
		if len(tools) == 0 {
			t.Fatalf("%s: an autoscaled executor must name its tools (TOOLBUS_EXECUTOR_TOOLS)", d.Name)
		}
		var want, got []string
		for _, tool := range tools {
			if _, ok := reg.Lookup(tool); !ok {
				t.Errorf("%s serves %q, which no pack registers", d.Name, tool)
			}
			want = append(want, events.ToolConsumer(tool))
		}
		for _, tr := range so.Spec.Triggers {
			md := tr.Metadata
			queues := events.QueueStreamName(events.DefaultStream)
			if tr.Type != "nats-jetstream" || md["stream"] != queues || md["natsServerMonitoringEndpoint"] == "" ||
				md["account"] == "" || md["lagThreshold"] == "" {
				t.Errorf("%s: trigger %+v is not a complete nats-jetstream trigger on stream %s", so.Name, tr, queues)
			}
			got = append(got, md["consumer"])
		}
		slices.Sort(want)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s watches queues %v, want the queues of its tools %v", so.Name, got, want)
		}
		if so.Spec.MinReplicaCount == nil || *so.Spec.MinReplicaCount < 1 {
			t.Errorf("%s: minReplicaCount must be at least 1 (a tool with no live executor is not offered)", so.Name)
		}
	}
	for _, d := range m.deployments {
		if d.Spec.Template.Labels["app.kubernetes.io/component"] == "executor" && !scaledTargets[d.Name] {
			t.Errorf("executor Deployment %s has no ScaledObject", d.Name)
		}
	}
}

func TestNATSValuesParse(t *testing.T) {
	raw, err := os.ReadFile("nats-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Config struct {
			Cluster struct {
				Enabled  bool `json:"enabled"`
				Replicas int  `json:"replicas"`
			} `json:"cluster"`
			JetStream struct {
				Enabled bool `json:"enabled"`
			} `json:"jetstream"`
			Monitor struct {
				Enabled bool `json:"enabled"`
				Port    int  `json:"port"`
			} `json:"monitor"`
		} `json:"config"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	if !v.Config.Cluster.Enabled || v.Config.Cluster.Replicas != 3 || !v.Config.JetStream.Enabled || !v.Config.Monitor.Enabled {
		t.Errorf("want a 3-node JetStream cluster with monitoring: %+v", v.Config)
	}
}

// roleOf is the NATS role a toolbus container acts as, from its command.
func roleOf(args []string) string {
	switch args[0] {
	case "init":
		return "admin"
	case "console", "mcp":
		return "client"
	}
	return args[0]
}

// secretRef returns the Secret name and key an env variable of c comes from.
func secretRef(c corev1.Container, name string) (string, string) {
	for _, e := range c.Env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			return e.ValueFrom.SecretKeyRef.Name, e.ValueFrom.SecretKeyRef.Key
		}
	}
	return "", ""
}

// diagTools are the tools of the diag pack (panic, big_output...): never deployed.
func diagTools(t *testing.T) []string {
	t.Helper()
	all, demo := executor.NewRegistry(), executor.NewRegistry()
	if err := packs.Register(all, "demo", "diag"); err != nil {
		t.Fatal(err)
	}
	if err := packs.Register(demo, "demo"); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, n := range all.Names() {
		if _, ok := demo.Lookup(n); !ok {
			out = append(out, n)
		}
	}
	return out
}

// TestManifestsSecureAsShipped: every pod connects to NATS as its own role with the
// credentials of the Secret toolbus-nats-<role> (never a shared admin), the diag pack is
// deployed nowhere, and the optional doors read their access lists from Secrets and
// probe /readyz.
func TestManifestsSecureAsShipped(t *testing.T) {
	m := load(t, ".", "optional")
	var containers []corev1.Container
	for _, d := range m.deployments {
		containers = append(containers, d.Spec.Template.Spec.Containers...)
	}
	for _, j := range m.jobs {
		containers = append(containers, j.Spec.Template.Spec.Containers...)
	}
	diag := diagTools(t)
	for _, c := range containers {
		role := roleOf(c.Args)
		for _, v := range []string{"TOOLBUS_NATS_USER", "TOOLBUS_NATS_PASSWORD"} {
			want := map[string]string{"TOOLBUS_NATS_USER": "user", "TOOLBUS_NATS_PASSWORD": "password"}[v]
			if name, key := secretRef(c, v); name != "toolbus-nats-"+role || key != want {
				t.Errorf("%s (%s): %s from Secret %q key %q, want toolbus-nats-%s key %s", c.Name, strings.Join(c.Args, " "), v, name, key, role, want)
			}
		}
		for _, e := range c.Env {
			if e.Name == "TOOLBUS_TOOLS" && strings.Contains(e.Value, "diag") {
				t.Errorf("%s serves the diag pack", c.Name)
			}
			if e.Name == "TOOLBUS_EXECUTOR_TOOLS" {
				for _, d := range diag {
					if slices.Contains(strings.Split(e.Value, ","), d) {
						t.Errorf("%s serves the diag tool %s", c.Name, d)
					}
				}
			}
		}
		for i, a := range c.Args {
			if a == "--tools" && i+1 < len(c.Args) {
				for _, d := range diag {
					if slices.Contains(strings.Split(c.Args[i+1], ","), d) {
						t.Errorf("%s sets up the queue of the diag tool %s", c.Name, d)
					}
				}
			}
		}
	}
	if tools := m.configMaps["toolbus"].Data["TOOLBUS_TOOLS"]; strings.Contains(tools, "diag") {
		t.Errorf("ConfigMap toolbus: TOOLBUS_TOOLS=%s includes the diag pack", tools)
	}
	doors := map[string]string{"console": "toolbus-console-users", "mcp": "toolbus-mcp-tokens"}
	for _, d := range m.deployments {
		c := d.Spec.Template.Spec.Containers[0]
		secret, ok := doors[c.Args[0]]
		if !ok {
			continue
		}
		delete(doors, c.Args[0])
		found := false
		for _, v := range d.Spec.Template.Spec.Volumes {
			found = found || (v.Secret != nil && v.Secret.SecretName == secret)
		}
		if !found {
			t.Errorf("%s does not read its access list from the Secret %s", d.Name, secret)
		}
		if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
			t.Errorf("%s: no /readyz readiness probe", d.Name)
		}
	}
	if len(doors) != 0 {
		t.Errorf("optional deployments missing: %v", doors)
	}
}

// TestNATSAuthForKubernetes parses the NATS configuration the Helm chart builds from
// nats-values.yaml (its $include of the Secret toolbus-nats-auth, holding nats-auth.conf
// and deploy/nats/permissions.conf) with nats-server's parser: one user per role, each
// with the permissions auth-users.conf gives it, its password from the role Secret's
// bcrypt key.
func TestNATSAuthForKubernetes(t *testing.T) {
	raw, err := os.ReadFile("nats-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Config struct {
			Merge map[string]any `json:"merge"`
		} `json:"config"`
		Container struct {
			Env map[string]struct {
				ValueFrom corev1.EnvVarSource `json:"valueFrom"`
			} `json:"env"`
		} `json:"container"`
	}
	if err := yaml.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	inc, _ := v.Config.Merge["$include"].(string)
	if inc == "" {
		t.Fatal("nats-values.yaml includes no authorization")
	}
	// The chart's layout: /etc/nats-config/nats.conf, the Secret at /etc/nats-auth.
	root := t.TempDir()
	for _, d := range []string{"nats-config", "nats-auth"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	copyFile := func(from, to string) {
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(to, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	copyFile("nats-auth.conf", filepath.Join(root, "nats-auth", "auth.conf"))
	copyFile(filepath.Join("..", "nats", "permissions.conf"), filepath.Join(root, "nats-auth", "permissions.conf"))
	conf := filepath.Join(root, "nats-config", "nats.conf")
	if err := os.WriteFile(conf, []byte("port: 4222\njetstream {}\ninclude "+inc+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	roles := []string{"admin", "planner", "executor", "injector", "client"}
	for _, r := range roles {
		envName := "TOOLBUS_" + strings.ToUpper(r) + "_PASSWORD"
		t.Setenv(envName, "pw-"+r)
		ref := v.Container.Env[envName].ValueFrom.SecretKeyRef
		if ref == nil || ref.Name != "toolbus-nats-"+r || ref.Key != "bcrypt" {
			t.Errorf("the NATS servers read %s from %+v, want Secret toolbus-nats-%s key bcrypt", envName, ref, r)
		}
	}
	k8sOpts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("the chart's config with nats-values.yaml's include: %v", err)
	}
	composeOpts, err := server.ProcessConfigFile(filepath.Join("..", "nats", "auth-users.conf"))
	if err != nil {
		t.Fatal(err)
	}
	perms := func(o *server.Options) map[string]string {
		out := map[string]string{}
		for _, u := range o.Users {
			b, _ := json.Marshal(u.Permissions)
			out[u.Username] = string(b)
		}
		return out
	}
	got, want := perms(k8sOpts), perms(composeOpts)
	for _, r := range roles {
		if got[r] == "" || got[r] != want[r] {
			t.Errorf("user %s: permissions %s, want those of auth-users.conf %s", r, got[r], want[r])
		}
	}
	if len(got) != len(want) {
		t.Errorf("users %v, want those of auth-users.conf %v", got, want)
	}
}
