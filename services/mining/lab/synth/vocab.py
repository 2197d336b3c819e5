"""Words the generator draws from: plot axes, diagram nodes, table cells and caption phrases."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

T = TypeVar("T")

PROTEINS = (
    "Ki-67",
    "CD31",
    "p53",
    "GFAP",
    "E-cadherin",
    "HER2",
    "CD68",
    "\u03b1-SMA",
    "collagen I",
    "vimentin",
    "PD-L1",
    "cleaved caspase-3",
    "β-catenin",
    "NeuN",
    "Iba1",
)
TISSUES = (
    "liver",
    "kidney",
    "lung",
    "breast tumour",
    "colon",
    "prostate",
    "skin",
    "hippocampus",
    "pancreatic islets",
    "myocardium",
    "lymph node",
)
CELLS = (
    "HeLa cells",
    "MCF-7 cells",
    "HEK293T cells",
    "A549 cells",
    "U2OS cells",
    "primary hepatocytes",
    "fibroblasts",
    "macrophages",
)
CONDITIONS = ("untreated", "after 24 h of treatment", "after siRNA knockdown", "under hypoxia", "at day 7")
GROUPS = (
    ("WT", "KO"),
    ("Ctrl", "Treated"),
    ("Vehicle", "Drug A", "Drug B"),
    ("siCtrl", "siRNA-1", "siRNA-2"),
    ("Sham", "MI", "MI + drug"),
    ("Young", "Aged"),
    ("Normal", "Tumour"),
)
QUANTITIES = (
    ("Relative expression", "relative mRNA expression"),
    ("Cell viability (%)", "cell viability"),
    ("Tumour volume (mm³)", "tumour volume"),
    ("Fluorescence (a.u.)", "mean fluorescence intensity"),
    ("Positive cells (%)", "the fraction of positive cells"),
    ("Body weight (g)", "body weight"),
    ("Serum ALT (U/l)", "serum ALT levels"),
    ("Migration (\u03bcm)", "migration distance"),
    ("Infarct size (%)", "infarct size"),
)
TIME_AXES = ("Time (h)", "Days", "Time (min)", "Weeks after injection", "Concentration (\u03bcM)")
GENES = (
    "TP53",
    "MYC",
    "EGFR",
    "KRAS",
    "CDH1",
    "VIM",
    "SOX2",
    "PTEN",
    "IL6",
    "TNF",
    "CD8A",
    "FOXP3",
    "GAPDH",
    "ACTB",
)
FINDINGS = {
    "ct": ("a hypodense lesion", "the pulmonary nodule", "the fracture line", "calcified plaque"),
    "mri": ("the enhancing lesion", "periventricular hyperintensities", "the cortical infarct", "the mass"),
    "ultrasound": ("increased vascular flow", "the hypoechoic nodule", "the thickened wall", "the effusion"),
    "fundus": ("microaneurysms", "haemorrhages", "hard exudates", "the optic disc"),
}
STRUCTURES = {
    "ihc": (
        "positive tumour cells",
        "stained glands",
        "stromal cells",
        "the basal layer",
        "infiltrating lymphocytes",
    ),
    "phase": ("rounded cells", "cell debris", "dividing cells", "membrane blebs"),
    "fluorescence": ("co-localized puncta", "nuclei", "positive cells", "cytoplasmic aggregates"),
    "em": ("nanoparticles", "hollow shells", "lattice defects", "aggregates", "grain boundaries"),
    "blot": ("the specific band", "the cleaved form", "the phosphorylated form"),
    "photo": ("the region of interest", "the device"),
    "map": ("the sampling site", "the fault line"),
}
FLOW_NODES = (
    "Patients (n = 120)",
    "Tumour biopsy",
    "RNA-seq",
    "Clustering",
    "Validation cohort",
    "Cell culture",
    "Transfection",
    "Drug treatment",
    "Imaging",
    "Flow cytometry",
    "Western blot",
    "Excluded (n = 14)",
    "Randomization",
    "Follow-up",
    "Analysis",
    "Receptor",
    "Kinase",
    "Transcription",
    "Apoptosis",
    "Proliferation",
    "Mouse model",
    "Tissue harvest",
)
TABLE_ROWS = (
    "Age (years)",
    "Male sex",
    "BMI (kg/m²)",
    "Smoker",
    "Diabetes",
    "Stage III/IV",
    "Tumour size (cm)",
    "CRP (mg/l)",
    "Follow-up (mo)",
    "Recurrence",
    "HbA1c (%)",
    "eGFR",
)
TABLE_HEADS = ("Characteristic", "Variable", "Parameter")
TABLE_GROUPS = ("Control", "Cases", "Cohort A", "Cohort B", "All", "Low", "High", "P value", "n")
PREAMBLES = (
    "Characterization of {protein} expression in {tissue}.",
    "Loss of {gene} impairs regeneration of the {tissue}.",
    "{protein} marks a subpopulation of cells in the {tissue}.",
    "Imaging and quantification of the {tissue} phenotype.",
    "Structural and functional analysis of {cells}.",
    "Treatment response in a mouse model of {tissue} injury.",
    "Representative findings in patients with {tissue} disease.",
    "Morphology of the synthesized nanostructures.",
)

NANO_PREAMBLE = "Morphology of the synthesized nanostructures."
# Preambles about patients: they fit figures whose image panels are all clinical images.
CLINICAL_PREAMBLES = {
    "Representative findings in patients with {tissue} disease.": frozenset(
        {"ct", "mri", "ultrasound", "fundus", "ihc", "photo"}
    ),
}


def pick(rng: np.random.Generator, items: Sequence[T]) -> T:
    return items[int(rng.integers(len(items)))]
