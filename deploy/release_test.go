package deploy_test

import (
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const (
	releaseFile    = "../.github/workflows/release.yml"
	chartFile      = "helm/courier/Chart.yaml"
	chartValues    = "helm/courier/values.yaml"
	deploymentFile = "kubernetes/deployment.yaml"
	componentFile  = "kustomize/courier/sidecar.yaml"
)

// TestReleaseImage: the release workflow builds courier's image for both
// platforms with an SBOM and provenance on a version tag, pushes it where
// the chart, the kustomize component and the Kubernetes example take it
// from, and refuses a tag the chart's version does not match.
func TestReleaseImage(t *testing.T) {
	var wf struct {
		On struct {
			Push struct {
				Tags []string `yaml:"tags"`
			} `yaml:"push"`
		} `yaml:"on"`
		Jobs map[string]struct {
			Steps []struct {
				Name string         `yaml:"name"`
				Uses string         `yaml:"uses"`
				Run  string         `yaml:"run"`
				With map[string]any `yaml:"with"`
			} `yaml:"steps"`
		} `yaml:"jobs"`
	}
	if err := yaml.Unmarshal(read(t, releaseFile), &wf); err != nil {
		t.Fatalf("%s: %v", releaseFile, err)
	}
	if !slices.Contains(wf.On.Push.Tags, "v*") {
		t.Errorf("%s: runs on tags %v, want v*", releaseFile, wf.On.Push.Tags)
	}
	var builds, images []string
	checksChart := false
	for job, j := range wf.Jobs {
		for _, s := range j.Steps {
			switch {
			case strings.HasPrefix(s.Uses, "docker/build-push-action@"):
				builds = append(builds, job)
				platforms := strings.Split(str(s.With["platforms"]), ",")
				for _, p := range []string{"linux/amd64", "linux/arm64"} {
					if !slices.Contains(platforms, p) {
						t.Errorf("%s: job %s builds for %v, without %s", releaseFile, job, platforms, p)
					}
				}
				if s.With["push"] != true {
					t.Errorf("%s: job %s does not push the image", releaseFile, job)
				}
				if s.With["sbom"] != true {
					t.Errorf("%s: job %s: sbom %v, want true (an SBOM attestation)", releaseFile, job, s.With["sbom"])
				}
				if s.With["provenance"] != "mode=max" {
					t.Errorf("%s: job %s: provenance %v, want mode=max", releaseFile, job, s.With["provenance"])
				}
			case strings.HasPrefix(s.Uses, "docker/metadata-action@"):
				images = append(images, strings.Fields(str(s.With["images"]))...)
			case strings.Contains(s.Run, "deploy/"+chartFile) && strings.Contains(s.Run, "GITHUB_REF_NAME"):
				checksChart = true
			}
		}
	}
	if len(builds) != 1 {
		t.Fatalf("%s: %d docker/build-push-action steps, want one", releaseFile, len(builds))
	}
	if !checksChart {
		t.Errorf("%s: no step checks deploy/%s's version against the tag", releaseFile, chartFile)
	}
	var values struct {
		Image struct {
			Repository string `yaml:"repository"`
		} `yaml:"image"`
	}
	if err := yaml.Unmarshal(read(t, chartValues), &values); err != nil {
		t.Fatal(err)
	}
	want := values.Image.Repository
	if !slices.Equal(images, []string{want}) {
		t.Errorf("%s pushes %v; %s's image.repository is %q", releaseFile, images, chartValues, want)
	}
	for _, f := range []string{deploymentFile, componentFile} {
		if !strings.Contains(string(read(t, f)), "image: "+want+":") {
			t.Errorf("%s runs no %s image: it would not run the release's", f, want)
		}
	}
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
