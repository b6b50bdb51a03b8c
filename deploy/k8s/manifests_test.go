// Package k8s_test checks the Kubernetes manifests of deploy/k8s against the Kubernetes
// API types (strict: an unknown or misspelled field fails) and against toolbus itself.
package k8s_test

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

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
}

type manifests struct {
	deployments map[string]*appsv1.Deployment
	jobs        []*batchv1.Job
	configMaps  map[string]*corev1.ConfigMap
	scaled      []*scaledObject
}

// load decodes every document of the files kustomization.yaml lists, strictly, with the
// type its apiVersion and kind name.
func load(t *testing.T) manifests {
	t.Helper()
	raw, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k kustomization
	if err := yaml.UnmarshalStrict(raw, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	files, _ := filepath.Glob("*.yaml")
	for _, f := range files {
		if f != "kustomization.yaml" && f != "nats-values.yaml" && !slices.Contains(k.Resources, f) {
			t.Errorf("%s is not listed in kustomization.yaml", f)
		}
	}
	m := manifests{deployments: map[string]*appsv1.Deployment{}, configMaps: map[string]*corev1.ConfigMap{}}
	for _, f := range k.Resources {
		raw, err := os.ReadFile(f)
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
	return m
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
// toolbus stream, tools that exist in the packs.
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
			if tr.Type != "nats-jetstream" || md["stream"] != "TOOLBUS" || md["natsServerMonitoringEndpoint"] == "" ||
				md["account"] == "" || md["lagThreshold"] == "" {
				t.Errorf("%s: trigger %+v is not a complete nats-jetstream trigger on stream TOOLBUS", so.Name, tr)
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
